package kube

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/kvstrata/kvstrata/planner"
)

var update = flag.Bool("update", false, "rewrite deploy/kvstrata.yaml from Manifests")

// golden is the deployment's manifests in the repository.
const golden = "../../../deploy/kvstrata.yaml"

func generated(t *testing.T) ([]runtime.Object, []byte) {
	t.Helper()
	objs, err := Manifests(Spec{})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteYAML(&buf, objs); err != nil {
		t.Fatal(err)
	}
	return objs, buf.Bytes()
}

// TestGolden keeps deploy/kvstrata.yaml what Manifests(Spec{}) writes.
func TestGolden(t *testing.T) {
	_, b := generated(t)
	if *update {
		if err := os.WriteFile(golden, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, want) {
		t.Fatalf("%s is not Manifests' output: go test ./planner/connector/kube -run TestGolden -update", golden)
	}
}

// decodeStrict reads a YAML stream into typed objects, refusing unknown
// or duplicate fields, as `kubectl apply --validate=strict` would.
func decodeStrict(t *testing.T, b []byte) []runtime.Object {
	t.Helper()
	dec := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	var objs []runtime.Object
	for i, doc := range strings.Split(string(b), "\n---\n") {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		js, err := yaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		obj, _, err := dec.Decode(js, nil, nil)
		if err != nil {
			t.Fatalf("document %d: %v\n%s", i, err, doc)
		}
		objs = append(objs, obj)
	}
	return objs
}

func stripComments(doc string) string {
	var keep []string
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

func TestStrictDecodeRejects(t *testing.T) {
	dec := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	js, err := yaml.YAMLToJSONStrict([]byte("apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {clusterIp: None}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := dec.Decode(js, nil, nil); err == nil {
		t.Fatal("a misspelt field (clusterIp) decoded: the check is not strict")
	}
	if _, err := yaml.YAMLToJSONStrict([]byte("a: 1\na: 2\n")); err == nil {
		t.Fatal("a duplicate key passed YAMLToJSONStrict")
	}
}

func TestManifestsDecodeStrictly(t *testing.T) {
	b, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	objs := decodeStrict(t, b)
	gen, _ := generated(t)
	if len(objs) != len(gen) {
		t.Fatalf("%d objects in %s, %d generated", len(objs), golden, len(gen))
	}
	var kinds []string
	podLabels := map[string]map[string]string{} // workload name → its pods' labels
	byName := map[string]runtime.Object{}
	for i, o := range objs {
		if !apiequality.Semantic.DeepEqual(o, gen[i]) {
			t.Errorf("object %d decodes to other than Manifests made:\n%#v\n%#v", i, o, gen[i])
		}
		m := o.(metav1.Object)
		if m.GetNamespace() != "kvstrata" {
			t.Errorf("%s %s in namespace %q", o.GetObjectKind().GroupVersionKind().Kind, m.GetName(), m.GetNamespace())
		}
		kind := o.GetObjectKind().GroupVersionKind().Kind
		kinds = append(kinds, kind+"/"+m.GetName())
		byName[kind+"/"+m.GetName()] = o
		var sel *metav1.LabelSelector
		var tmpl corev1.PodTemplateSpec
		switch w := o.(type) {
		case *appsv1.Deployment:
			sel, tmpl = w.Spec.Selector, w.Spec.Template
		case *appsv1.StatefulSet:
			sel, tmpl = w.Spec.Selector, w.Spec.Template
		default:
			continue
		}
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil {
			t.Fatal(err)
		}
		if s.Empty() || !s.Matches(labels.Set(tmpl.Labels)) {
			t.Errorf("%s: selector %v does not match its pods' labels %v", m.GetName(), s, tmpl.Labels)
		}
		podLabels[m.GetName()] = tmpl.Labels
	}
	want := []string{
		"Service/kvstrata-cache", "StatefulSet/kvstrata-cache",
		"Deployment/kvstrata-prefill", "Deployment/kvstrata-decode",
		"Service/kvstrata-frontend", "Deployment/kvstrata-frontend",
		"ServiceAccount/kvstrata-planner", "Role/kvstrata-planner", "RoleBinding/kvstrata-planner", "Deployment/kvstrata-planner",
	}
	if !slices.Equal(kinds, want) {
		t.Fatalf("objects %v, want %v", kinds, want)
	}

	// Each Service selects the pods of exactly its workload.
	for svc, workload := range map[string]string{"kvstrata-cache": "kvstrata-cache", "kvstrata-frontend": "kvstrata-frontend"} {
		sel := labels.SelectorFromSet(byName["Service/"+svc].(*corev1.Service).Spec.Selector)
		for name, l := range podLabels {
			if got := sel.Matches(labels.Set(l)); got != (name == workload) {
				t.Errorf("Service %s selects %s's pods: %v", svc, name, got)
			}
		}
	}
	headless := byName["Service/kvstrata-cache"].(*corev1.Service)
	sts := byName["StatefulSet/kvstrata-cache"].(*appsv1.StatefulSet)
	if headless.Spec.ClusterIP != corev1.ClusterIPNone || sts.Spec.ServiceName != headless.Name || !headless.Spec.PublishNotReadyAddresses {
		t.Errorf("the cache's Service is not the StatefulSet's headless Service: %+v", headless.Spec)
	}
	// The bootstrap list names every node by its headless DNS name, the
	// name each node takes as its raft address.
	args := strings.Join(sts.Spec.Template.Spec.Containers[0].Args, " ")
	for _, want := range []string{
		"--cluster-bootstrap=1=kvstrata-cache-0.kvstrata-cache.kvstrata.svc.cluster.local:7072,2=kvstrata-cache-1.kvstrata-cache.kvstrata.svc.cluster.local:7072,3=kvstrata-cache-2.kvstrata-cache.kvstrata.svc.cluster.local:7072",
		"--cluster-raft-addr=$(POD_NAME).kvstrata-cache.$(POD_NAMESPACE).svc.cluster.local:7072",
	} {
		if !strings.Contains(args, want) {
			t.Errorf("cache args %q lack %q", args, want)
		}
	}

	// The planner may read the workloads and change their scale, nothing more.
	role := byName["Role/kvstrata-planner"].(*rbacv1.Role)
	verbs := map[string][]string{}
	for _, r := range role.Rules {
		if !slices.Equal(r.APIGroups, []string{"apps"}) {
			t.Errorf("rule %v outside the apps group", r)
		}
		for _, res := range r.Resources {
			verbs[res] = append(verbs[res], r.Verbs...)
		}
	}
	for res, want := range map[string][]string{
		"deployments": {"get", "list", "watch"}, "statefulsets": {"get", "list", "watch"},
		"deployments/scale": {"get", "update", "patch"}, "statefulsets/scale": {"get", "update", "patch"},
	} {
		if !slices.Equal(verbs[res], want) {
			t.Errorf("%s: verbs %v, want %v", res, verbs[res], want)
		}
	}
	if len(verbs) != 4 {
		t.Errorf("the role names %d resources, want 4: %v", len(verbs), verbs)
	}
	rb := byName["RoleBinding/kvstrata-planner"].(*rbacv1.RoleBinding)
	pl := byName["Deployment/kvstrata-planner"].(*appsv1.Deployment)
	if rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != role.Name || len(rb.Subjects) != 1 ||
		rb.Subjects[0].Kind != "ServiceAccount" || rb.Subjects[0].Name != pl.Spec.Template.Spec.ServiceAccountName {
		t.Errorf("the binding does not give the planner's service account its role: %+v", rb)
	}

	// The planner scales exactly the worker Deployments there are.
	var targets string
	for _, a := range pl.Spec.Template.Spec.Containers[0].Args {
		if v, ok := strings.CutPrefix(a, "--kube-targets="); ok {
			targets = v
		}
	}
	ts, err := ParseTargets(targets)
	if err != nil {
		t.Fatalf("the planner's --kube-targets: %v", err)
	}
	for p, tg := range ts {
		if _, ok := byName[tg.String()]; !ok {
			t.Errorf("pool %s's target %s is not in the manifests", p, tg)
		}
	}
	if len(ts) != 2 {
		t.Errorf("targets %v, want prefill and decode", ts)
	}
}

func TestManifestsAggregated(t *testing.T) {
	objs, err := Manifests(Spec{Aggregated: 4, NoPlanner: true, Namespace: "llm", WorkerArgs: []string{"--model=tiny"}})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range objs {
		names = append(names, o.(metav1.Object).GetName())
		if d, ok := o.(*appsv1.Deployment); ok && d.Name == WorkerName(planner.Aggregated) {
			c := d.Spec.Template.Spec.Containers[0]
			if *d.Spec.Replicas != 4 || !slices.Contains(c.Args, "--role=aggregated") || c.Args[len(c.Args)-1] != "--model=tiny" {
				t.Errorf("aggregated workers: replicas %d, args %v", *d.Spec.Replicas, c.Args)
			}
		}
	}
	want := []string{"kvstrata-cache", "kvstrata-cache", "kvstrata-aggregated", "kvstrata-frontend", "kvstrata-frontend"}
	if !slices.Equal(names, want) {
		t.Fatalf("objects %v, want %v", names, want)
	}
	var buf bytes.Buffer
	if err := WriteYAML(&buf, objs); err != nil {
		t.Fatal(err)
	}
	if got := decodeStrict(t, buf.Bytes()); len(got) != len(objs) {
		t.Fatalf("%d objects decoded, %d written", len(got), len(objs))
	}
}

func TestManifestsRejectBadSpec(t *testing.T) {
	for _, s := range []Spec{
		{Aggregated: 2, Prefill: 1},
		{Decode: -1, Prefill: 1},
		{CacheNodes: -3},
		{CacheStorage: "lots"},
	} {
		if _, err := Manifests(s); !errors.Is(err, ErrBadSpec) {
			t.Errorf("Manifests(%+v) = %v, want ErrBadSpec", s, err)
		}
	}
}
