package kube

import (
	"context"
	"errors"
	"strconv"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kvstrata/kvstrata/planner"
)

const ns = "kvstrata"

func testDeployment(name string, replicas, ready int32) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, ResourceVersion: "1"},
		Spec:       appsv1.DeploymentSpec{Replicas: &replicas},
		Status:     appsv1.DeploymentStatus{ReadyReplicas: ready},
	}
}

func testStatefulSet(name string, replicas, ready int32) *appsv1.StatefulSet {
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, ResourceVersion: "1"},
		Spec:       appsv1.StatefulSetSpec{Replicas: &replicas},
		Status:     appsv1.StatefulSetStatus{ReadyReplicas: ready},
	}
}

// scaleServer serves the scale subresource of deployments and statefulsets
// from the fake clientset's tracker, as the API server does: the Scale's
// spec is the workload's spec.replicas, its resourceVersion the
// workload's, and an update with another resourceVersion is a Conflict.
// The fake tracker does not serve subresources itself.
type scaleServer struct {
	cs *fake.Clientset
	// beforeUpdate runs before each update is checked; a test changes the
	// workload there to race the connector.
	beforeUpdate func()
	updates      int
}

func newFake(t *testing.T, objs ...runtime.Object) (*fake.Clientset, *scaleServer) {
	t.Helper()
	cs := fake.NewClientset(objs...)
	s := &scaleServer{cs: cs}
	for _, res := range []string{"deployments", "statefulsets"} {
		cs.PrependReactor("get", res, s.get)
		cs.PrependReactor("update", res, s.update)
	}
	return cs, s
}

// workload reads the object behind a scale action; replicas points into it.
func (s *scaleServer) workload(res schema.GroupVersionResource, ns, name string) (runtime.Object, *metav1.ObjectMeta, **int32, error) {
	obj, err := s.cs.Tracker().Get(res, ns, name)
	if err != nil {
		return nil, nil, nil, err
	}
	switch w := obj.(type) {
	case *appsv1.Deployment:
		return w, &w.ObjectMeta, &w.Spec.Replicas, nil
	case *appsv1.StatefulSet:
		return w, &w.ObjectMeta, &w.Spec.Replicas, nil
	}
	return nil, nil, nil, errors.New("not a workload")
}

func (s *scaleServer) get(a k8stesting.Action) (bool, runtime.Object, error) {
	g := a.(k8stesting.GetAction)
	if g.GetSubresource() != "scale" {
		return false, nil, nil
	}
	_, meta, replicas, err := s.workload(a.GetResource(), a.GetNamespace(), g.GetName())
	if err != nil {
		return true, nil, err
	}
	return true, &autoscalingv1.Scale{
		ObjectMeta: metav1.ObjectMeta{Name: meta.Name, Namespace: meta.Namespace, ResourceVersion: meta.ResourceVersion},
		Spec:       autoscalingv1.ScaleSpec{Replicas: **replicas},
	}, nil
}

func (s *scaleServer) update(a k8stesting.Action) (bool, runtime.Object, error) {
	u := a.(k8stesting.UpdateAction)
	if u.GetSubresource() != "scale" {
		return false, nil, nil
	}
	s.updates++
	if s.beforeUpdate != nil {
		s.beforeUpdate()
	}
	sc := u.GetObject().(*autoscalingv1.Scale)
	obj, meta, replicas, err := s.workload(a.GetResource(), a.GetNamespace(), sc.Name)
	if err != nil {
		return true, nil, err
	}
	if sc.ResourceVersion != meta.ResourceVersion {
		return true, nil, apierrors.NewConflict(a.GetResource().GroupResource(), sc.Name,
			errors.New("the object has been modified"))
	}
	n := sc.Spec.Replicas
	*replicas = &n
	bump(meta)
	return true, sc, s.cs.Tracker().Update(a.GetResource(), obj, a.GetNamespace())
}

func bump(meta *metav1.ObjectMeta) {
	v, _ := strconv.Atoi(meta.ResourceVersion)
	meta.ResourceVersion = strconv.Itoa(v + 1)
}

// editInTracker sets a deployment's spec.replicas straight in the fake's
// object tracker: what a reactor does, which may not call the clientset
// (the fake holds its lock while reactors run).
func editInTracker(t *testing.T, cs *fake.Clientset, name string, n int32) {
	t.Helper()
	gvr := appsv1.SchemeGroupVersion.WithResource("deployments")
	obj, err := cs.Tracker().Get(gvr, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	d := obj.(*appsv1.Deployment)
	d.Spec.Replicas = &n
	bump(&d.ObjectMeta)
	if err := cs.Tracker().Update(gvr, d, ns); err != nil {
		t.Fatal(err)
	}
}

// editByHand sets a deployment's spec.replicas as `kubectl scale` would.
func editByHand(t *testing.T, cs *fake.Clientset, name string, n int32) {
	t.Helper()
	ctx := context.Background()
	d, err := cs.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.Spec.Replicas = &n
	bump(&d.ObjectMeta)
	if _, err := cs.AppsV1().Deployments(ns).Update(ctx, d, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func specReplicas(t *testing.T, cs *fake.Clientset, kind, name string) int32 {
	t.Helper()
	ctx := context.Background()
	if kind == KindStatefulSet {
		s, err := cs.AppsV1().StatefulSets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return *s.Spec.Replicas
	}
	d, err := cs.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return *d.Spec.Replicas
}

var targets = map[planner.Pool]Target{
	planner.Prefill: {Kind: KindDeployment, Name: "kvstrata-prefill"},
	planner.Decode:  {Kind: KindStatefulSet, Name: "kvstrata-decode"},
}

func TestScaleAndReplicas(t *testing.T) {
	ctx := context.Background()
	cs, srv := newFake(t, testDeployment("kvstrata-prefill", 1, 1), testStatefulSet("kvstrata-decode", 2, 1))
	c := New(cs, ns, targets)

	got, err := c.Replicas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[planner.Pool]planner.Replicas{planner.Prefill: {Desired: 1, Ready: 1}, planner.Decode: {Desired: 2, Ready: 1}}
	if len(got) != 2 || got[planner.Prefill] != want[planner.Prefill] || got[planner.Decode] != want[planner.Decode] {
		t.Fatalf("Replicas = %v, want %v", got, want)
	}
	if err := c.Scale(ctx, planner.Prefill, 3); err != nil {
		t.Fatal(err)
	}
	if err := c.Scale(ctx, planner.Decode, 4); err != nil {
		t.Fatal(err)
	}
	if n := specReplicas(t, cs, KindDeployment, "kvstrata-prefill"); n != 3 {
		t.Fatalf("prefill spec.replicas = %d, want 3", n)
	}
	if n := specReplicas(t, cs, KindStatefulSet, "kvstrata-decode"); n != 4 {
		t.Fatalf("decode spec.replicas = %d, want 4", n)
	}
	if srv.updates != 2 {
		t.Fatalf("%d scale updates, want 2", srv.updates)
	}
	// Asking for the size it has is no write.
	if err := c.Scale(ctx, planner.Decode, 4); err != nil {
		t.Fatal(err)
	}
	if srv.updates != 2 {
		t.Fatalf("scaling to the current size updated: %d updates", srv.updates)
	}
	if err := c.Scale(ctx, planner.Aggregated, 1); !errors.Is(err, ErrUnknownPool) {
		t.Fatalf("Scale of a pool without a target: %v, want ErrUnknownPool", err)
	}
	if _, err := New(cs, ns, map[planner.Pool]Target{planner.Prefill: {Kind: KindDeployment, Name: "missing"}}).Replicas(ctx); !apierrors.IsNotFound(err) {
		t.Fatalf("Replicas of a missing deployment: %v, want NotFound", err)
	}
}

// Someone changes the deployment between the connector's read and write:
// the update is a Conflict, and the connector reads again and wins.
func TestScaleRetriesConflictOnce(t *testing.T) {
	ctx := context.Background()
	cs, srv := newFake(t, testDeployment("kvstrata-prefill", 1, 1))
	c := New(cs, ns, targets)
	raced := false
	srv.beforeUpdate = func() {
		if !raced {
			raced = true
			editInTracker(t, cs, "kvstrata-prefill", 7)
		}
	}
	if err := c.Scale(ctx, planner.Prefill, 3); err != nil {
		t.Fatalf("Scale after one conflict: %v", err)
	}
	if n := specReplicas(t, cs, KindDeployment, "kvstrata-prefill"); n != 3 {
		t.Fatalf("spec.replicas = %d, want 3", n)
	}
	if srv.updates != 2 {
		t.Fatalf("%d updates, want 2 (one conflict, one retry)", srv.updates)
	}

	// A conflict on every write: one retry only, and the error says so.
	srv.updates = 0
	srv.beforeUpdate = func() { editInTracker(t, cs, "kvstrata-prefill", 9) }
	err := c.Scale(ctx, planner.Prefill, 2)
	if !apierrors.IsConflict(err) {
		t.Fatalf("Scale with conflicts on every write: %v, want a Conflict", err)
	}
	if srv.updates != 2 {
		t.Fatalf("%d updates, want 2 (no second retry)", srv.updates)
	}
}

// A person scales a deployment by hand: Replicas reports it, which is how
// the planner's core sees a manual change.
func TestReplicasSeesManualEdit(t *testing.T) {
	ctx := context.Background()
	cs, _ := newFake(t, testDeployment("kvstrata-prefill", 1, 1), testStatefulSet("kvstrata-decode", 1, 1))
	c := New(cs, ns, targets)
	if err := c.Scale(ctx, planner.Prefill, 2); err != nil {
		t.Fatal(err)
	}
	editByHand(t, cs, "kvstrata-prefill", 5)
	got, err := c.Replicas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got[planner.Prefill].Desired != 5 {
		t.Fatalf("after a manual edit to 5: %+v", got[planner.Prefill])
	}
}

func TestParseTargets(t *testing.T) {
	got, err := ParseTargets("prefill=Deployment/kvstrata-prefill, decode=StatefulSet/kvstrata-decode")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[planner.Prefill] != (Target{KindDeployment, "kvstrata-prefill"}) || got[planner.Decode] != (Target{KindStatefulSet, "kvstrata-decode"}) {
		t.Fatalf("ParseTargets = %v", got)
	}
	if s := FormatTargets(got); s != "decode=StatefulSet/kvstrata-decode,prefill=Deployment/kvstrata-prefill" {
		t.Fatalf("FormatTargets = %q", s)
	}
	for _, bad := range []string{"", "prefill", "gpu=Deployment/x", "prefill=Pod/x", "prefill=Deployment/", "prefill=Deployment", "prefill=Deployment/a,prefill=Deployment/b"} {
		if _, err := ParseTargets(bad); !errors.Is(err, ErrBadTarget) {
			t.Errorf("ParseTargets(%q) = %v, want ErrBadTarget", bad, err)
		}
	}
}

func TestNamespace(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "llm")
	if got := Namespace(); got != "llm" {
		t.Fatalf("Namespace with POD_NAMESPACE=llm: %q", got)
	}
}
