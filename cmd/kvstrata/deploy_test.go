package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/kvstrata/kvstrata/config"
)

// The deployment files — deploy/k8s/cache.yaml and deploy/systemd —
// checked as far as a machine without a cluster or an init system allows:
// each decodes or verifies with the tools that would run it, and each
// agrees with the node it runs. deploy/image checks the Dockerfile.

const cacheManifests = "../../deploy/k8s/cache.yaml"

// decodeManifests reads a YAML stream into typed objects, refusing unknown
// and duplicate fields, as `kubectl apply --validate=strict` would.
func decodeManifests(t *testing.T, b []byte) []runtime.Object {
	t.Helper()
	dec := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	var objs []runtime.Object
	for i, doc := range regexp.MustCompile(`(?m)^---$`).Split(string(b), -1) {
		js, err := yaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		if string(js) == "null" {
			continue // comments only
		}
		obj, _, err := dec.Decode(js, nil, nil)
		if err != nil {
			t.Fatalf("document %d: %v\n%s", i, err, doc)
		}
		objs = append(objs, obj)
	}
	return objs
}

// The decoding is strict: a misspelt field fails it.
func TestDecodeManifestsIsStrict(t *testing.T) {
	dec := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	js, err := yaml.YAMLToJSONStrict([]byte("apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: x}\nspec: {serviceNam: x}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := dec.Decode(js, nil, nil); err == nil {
		t.Fatal("a misspelt field (serviceNam) decoded")
	}
}

// cacheObjects are the objects of deploy/k8s/cache.yaml, one of each kind
// but the Services.
type cacheObjects struct {
	cm       *corev1.ConfigMap
	headless *corev1.Service
	services []*corev1.Service
	sts      *appsv1.StatefulSet
	pdb      *policyv1.PodDisruptionBudget
}

func loadCacheObjects(t *testing.T) cacheObjects {
	t.Helper()
	b, err := os.ReadFile(cacheManifests)
	if err != nil {
		t.Fatal(err)
	}
	var o cacheObjects
	for _, obj := range decodeManifests(t, b) {
		switch v := obj.(type) {
		case *corev1.ConfigMap:
			o.cm = v
		case *corev1.Service:
			o.services = append(o.services, v)
		case *appsv1.StatefulSet:
			o.sts = v
		case *policyv1.PodDisruptionBudget:
			o.pdb = v
		default:
			t.Fatalf("%s: unexpected %T", cacheManifests, obj)
		}
	}
	if o.cm == nil || o.sts == nil || o.pdb == nil || len(o.services) != 2 {
		t.Fatalf("%s: want a ConfigMap, a StatefulSet, a PodDisruptionBudget and two Services", cacheManifests)
	}
	for _, s := range o.services {
		if s.Name == o.sts.Spec.ServiceName {
			o.headless = s
		}
	}
	if o.headless == nil {
		t.Fatalf("the StatefulSet's serviceName %q is none of the Services", o.sts.Spec.ServiceName)
	}
	return o
}

// podEnv is the environment Kubernetes gives container c of pod name in
// namespace ns with pod index index: downward-API fields filled, $(VAR)
// references to earlier variables expanded.
func podEnv(t *testing.T, c corev1.Container, name, ns string, index int) map[string]string {
	t.Helper()
	env := map[string]string{}
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil {
			if e.ValueFrom.FieldRef == nil {
				t.Fatalf("env %s: only fieldRef is understood here", e.Name)
			}
			switch p := e.ValueFrom.FieldRef.FieldPath; p {
			case "metadata.name":
				v = name
			case "metadata.namespace":
				v = ns
			case "metadata.labels['apps.kubernetes.io/pod-index']":
				v = strconv.Itoa(index)
			case "status.podIP":
				v = "10.0.0.7"
			default:
				t.Fatalf("env %s: field %s is not understood here", e.Name, p)
			}
		}
		env[e.Name] = ref.ReplaceAllStringFunc(v, func(m string) string {
			if x, ok := env[m[2:len(m)-1]]; ok {
				return x
			}
			return m // Kubernetes leaves an unknown reference as it is
		})
	}
	return env
}

func portOf(t *testing.T, addr string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	n, err2 := strconv.Atoi(p)
	if err != nil || err2 != nil {
		t.Fatalf("address %q has no port", addr)
	}
	return int32(n)
}

// deploy/k8s/cache.yaml decodes strictly, and every pod of its StatefulSet
// runs a node whose configuration — the ConfigMap's file and the
// environment the downward API fills — loads, listens on the container's
// ports, advertises the pod's stable DNS name and finds itself in the
// bootstrap list; the Services, the budget and the volumes fit.
func TestCacheManifestsDecodeStrictlyAndFitTheNode(t *testing.T) {
	o := loadCacheObjects(t)
	sts, spec := o.sts, o.sts.Spec
	pod := spec.Template.Spec
	podLabels := labels.Set(spec.Template.Labels)
	if spec.Replicas == nil || *spec.Replicas != 3 {
		t.Fatalf("replicas %v, want 3", spec.Replicas)
	}
	replicas := int(*spec.Replicas)
	if spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Error("pods start one by one: the first never becomes ready without a quorum")
	}
	if spec.Ordinals == nil || spec.Ordinals.Start != 1 {
		t.Fatal("the pods are not numbered from 1: a node id must be > 0")
	}
	if !o.headless.Spec.PublishNotReadyAddresses || o.headless.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Error("the peers' Service is not headless with unready addresses published: nodes cannot find each other before a leader is elected")
	}
	sel, err := metav1.LabelSelectorAsSelector(spec.Selector)
	if err != nil || !sel.Matches(podLabels) {
		t.Errorf("the StatefulSet's selector does not select its pods: %v", err)
	}
	if sel, err := metav1.LabelSelectorAsSelector(o.pdb.Spec.Selector); err != nil || !sel.Matches(podLabels) {
		t.Errorf("the PodDisruptionBudget does not select the pods: %v", err)
	}
	if mu := o.pdb.Spec.MaxUnavailable; mu == nil || replicas-mu.IntValue() < replicas/2+1 {
		t.Errorf("the PodDisruptionBudget lets %v of %d nodes go: the rest has no quorum", mu, replicas)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for _, s := range o.services {
		if !labels.SelectorFromSet(s.Spec.Selector).Matches(podLabels) || len(s.Spec.Selector) == 0 {
			t.Errorf("Service %s does not select the pods", s.Name)
		}
		for _, p := range s.Spec.Ports {
			if n, ok := ports[p.TargetPort.String()]; !ok || n != p.Port {
				t.Errorf("Service %s port %s: target %s is not the container's port %d", s.Name, p.Name, p.TargetPort.String(), p.Port)
			}
		}
	}

	// The configuration: --config names the ConfigMap's file where the
	// ConfigMap is mounted.
	i := slices.Index(c.Args, "--config")
	if len(c.Args) < 1 || c.Args[0] != "serve" || i < 0 || i+1 >= len(c.Args) {
		t.Fatalf("container args %q: want serve --config FILE", c.Args)
	}
	cfgPath := c.Args[i+1]
	mounted := map[string]string{} // mount path → volume
	for _, m := range c.VolumeMounts {
		mounted[m.MountPath] = m.Name
	}
	vol := mounted[filepath.Dir(cfgPath)]
	if !slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool {
		return v.Name == vol && v.ConfigMap != nil && v.ConfigMap.Name == o.cm.Name
	}) {
		t.Fatalf("%s is not in the ConfigMap %s's volume", cfgPath, o.cm.Name)
	}
	text, ok := o.cm.Data[filepath.Base(cfgPath)]
	if !ok {
		t.Fatalf("ConfigMap %s has no %s", o.cm.Name, filepath.Base(cfgPath))
	}
	file := filepath.Join(t.TempDir(), "kvstrata.toml")
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	headlessHost := func(n int) string {
		return fmt.Sprintf("%s-%d.%s.kvstrata.svc.cluster.local", sts.Name, n, o.headless.Name)
	}
	for n := 1; n <= replicas; n++ {
		env := podEnv(t, c, fmt.Sprintf("%s-%d", sts.Name, n), "kvstrata", n)
		l, err := config.Load(file, func(k string) string { return env[k] }, nil)
		if err != nil {
			t.Fatalf("pod %d: the node's configuration: %v", n, err)
		}
		if l.NodeID != uint32(n) {
			t.Errorf("pod %d runs node-id %d", n, l.NodeID)
		}
		for name, addr := range map[string]string{"grpc": l.Listen.GRPC, "data": l.Listen.Data, "resp": l.Listen.RESP,
			"http": l.Listen.HTTP, "raft": l.Cluster.RaftAddr} {
			if portOf(t, addr) != ports[name] {
				t.Errorf("the node listens for %s on %s; the container's port %s is %d", name, addr, name, ports[name])
			}
			key := map[string]string{"grpc": "listen.grpc", "data": "listen.data", "resp": "listen.resp", "http": "listen.http", "raft": "cluster.raft-addr"}[name]
			adv, err := l.AdvertisedAddr(key, "")
			if want := net.JoinHostPort(headlessHost(n), strconv.Itoa(int(ports[name]))); err != nil || adv != want {
				t.Errorf("pod %d advertises %s at %q (%v), want its DNS name, %s", n, name, adv, err, want)
			}
		}
		peers, err := config.ParsePeers(l.Cluster.Bootstrap)
		if err != nil || len(peers) != replicas {
			t.Fatalf("bootstrap %q: %v", l.Cluster.Bootstrap, err)
		}
		for _, p := range peers {
			if want := net.JoinHostPort(headlessHost(int(p.ID)), strconv.Itoa(int(ports["raft"]))); p.RaftAddr != want {
				t.Errorf("bootstrap lists node %d at %s, want %s", p.ID, p.RaftAddr, want)
			}
		}
		if m := mounted[l.DataDir]; m == "" || !slices.ContainsFunc(spec.VolumeClaimTemplates, func(pvc corev1.PersistentVolumeClaim) bool { return pvc.Name == m }) {
			t.Errorf("data-dir %s is not a volume of the claim templates", l.DataDir)
		}
		if lim := c.Resources.Limits.Memory(); lim.Value() <= int64(l.DRAM.Capacity) {
			t.Errorf("memory limit %v does not hold dram.capacity %v", lim, l.DRAM.Capacity)
		}
		if g := pod.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= l.ShutdownTimeout {
			t.Errorf("terminationGracePeriodSeconds %v is not over shutdown-timeout %v", g, l.ShutdownTimeout)
		}
	}

	// Probes: liveness on /healthz, readiness on /readyz, of the HTTP port.
	if c.LivenessProbe == nil || c.ReadinessProbe == nil || c.StartupProbe == nil {
		t.Fatal("the container lacks a startup, liveness or readiness probe")
	}
	for _, pr := range []struct {
		probe *corev1.Probe
		path  string
	}{{c.StartupProbe, "/healthz"}, {c.LivenessProbe, "/healthz"}, {c.ReadinessProbe, "/readyz"}} {
		g := pr.probe.HTTPGet
		if g == nil || g.Path != pr.path || g.Port.String() != "http" {
			t.Errorf("a probe gets %+v, want %s on the http port", g, pr.path)
		}
	}

	// Non-root, no privilege, read-only root.
	psc, csc := pod.SecurityContext, c.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Error("the pod may run as root")
	}
	if csc == nil || csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation ||
		csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem ||
		csc.Capabilities == nil || !slices.Contains(csc.Capabilities.Drop, "ALL") {
		t.Error("the container may escalate privileges, write its root file system or keep capabilities")
	}
}

// The probe paths of the manifest answer on a ready node's HTTP server.
func TestCacheManifestsProbePathsAnswerOnTheNode(t *testing.T) {
	c := loadCacheObjects(t).sts.Spec.Template.Spec.Containers[0]
	p := startNode(t, t.TempDir())
	for _, pr := range []*corev1.Probe{c.StartupProbe, c.LivenessProbe, c.ReadinessProbe} {
		resp, err := http.Get("http://" + p.http + pr.HTTPGet.Path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s on a ready node: %s", pr.HTTPGet.Path, resp.Status)
		}
	}
}

// unitFile reads a systemd unit into section → key → values.
func unitFile(t *testing.T, path string) map[string]map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[':
			section = strings.Trim(line, "[]")
			out[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s: %q is no key=value in a section", path, line)
			}
			out[section][k] = append(out[section][k], v)
		}
	}
	return out
}

const unitPath = "../../deploy/systemd/kvstrata.service"

// The systemd unit has what a service of a cache node needs, and its
// command line with the example configuration is one the node accepts.
func TestSystemdUnitRunsTheNodeWithItsConfiguration(t *testing.T) {
	u := unitFile(t, unitPath)
	svc := u["Service"]
	for key, want := range map[string]string{"User": "kvstrata", "StateDirectory": "kvstrata", "Restart": "on-failure",
		"LimitNOFILE": "65536", "NoNewPrivileges": "yes", "ProtectSystem": "strict", "RestartPreventExitStatus": "2"} {
		if got := svc[key]; len(got) != 1 || got[0] != want {
			t.Errorf("[Service] %s = %q, want %s", key, got, want)
		}
	}
	if u["Install"]["WantedBy"] == nil {
		t.Error("no [Install] WantedBy: systemctl enable has nothing to do")
	}
	line := strings.Fields(svc["ExecStart"][0])
	if len(line) < 2 || line[0] != "/usr/local/bin/kvstrata" || line[1] != "serve" {
		t.Fatalf("ExecStart %q does not run kvstrata serve", line)
	}
	args := line[1:]
	if i := slices.Index(args, "--data-dir"); i < 0 || args[i+1] != "/var/lib/"+svc["StateDirectory"][0] {
		t.Errorf("ExecStart's --data-dir is not the StateDirectory")
	}
	// The unit's flags, the example file in place of /etc/kvstrata's and
	// a data directory and DRAM size this machine has.
	for i, a := range args {
		if a == "/etc/kvstrata/kvstrata.toml" {
			args[i] = "../../deploy/systemd/kvstrata.toml"
		}
	}
	args = append(args, "--data-dir", t.TempDir(), "--dram-capacity", "64MiB", "--ssd-capacity", "1GiB", "--print-config")
	var out, errOut bytes.Buffer
	os.Unsetenv("KVSTRATA_CONFIG")
	if code := execute(context.Background(), args, &out, &errOut); code != 0 {
		t.Fatalf("kvstrata %s: exit %d:\n%s", strings.Join(args, " "), code, errOut.String())
	}
	for _, want := range []string{`host = "kvstrata-1.example.com"`, `grpc = "0.0.0.0:7070"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the effective configuration does not say %s:\n%s", want, out.String())
		}
	}
}

// systemd-analyze verify finds nothing to say about the unit (it exits 0
// on unknown keys and bad values too, so any line it prints fails).
func TestSystemdAnalyzeVerifiesTheUnit(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("no systemd-analyze on this machine; TestSystemdUnitRunsTheNodeWithItsConfiguration checks the unit's keys")
	}
	verify := func(unit string) string {
		dir := t.TempDir()
		path := filepath.Join(dir, "kvstrata.service")
		// The binary the unit names is not installed here: the test's is.
		unit = strings.ReplaceAll(unit, "/usr/local/bin/kvstrata", binary)
		if err := os.WriteFile(path, []byte(unit), 0o644); err != nil {
			t.Fatal(err)
		}
		out, _ := exec.Command("systemd-analyze", "verify", path).CombinedOutput()
		return strings.TrimSpace(string(out))
	}
	raw, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	if out := verify(string(raw)); out != "" {
		t.Errorf("systemd-analyze verify %s:\n%s", unitPath, out)
	}
	// The check is not vacuous.
	if out := verify(strings.Replace(string(raw), "Restart=on-failure", "Restart=sometimes", 1)); out == "" {
		t.Error("systemd-analyze verify says nothing of Restart=sometimes")
	}
}
