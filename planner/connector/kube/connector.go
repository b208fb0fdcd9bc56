// Package kube carries out a planner's decisions on Kubernetes: it scales
// Deployments and StatefulSets through their scale subresource, and it
// generates the manifests of a whole kvstrata deployment (Manifests).
//
// A Connector holds no state of its own beyond its targets: every call
// reads the cluster afresh, so it is safe for concurrent use and a manual
// edit of a workload is seen on the next Replicas.
package kube

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kvstrata/kvstrata/planner"
)

// Kinds of workload a Target names.
const (
	KindDeployment  = "Deployment"
	KindStatefulSet = "StatefulSet"
)

// ErrUnknownPool is returned by Scale for a pool the connector has no
// target for.
var ErrUnknownPool = errors.New("kube: no target for pool")

// ErrBadTarget marks a malformed target or target list.
var ErrBadTarget = errors.New("kube: bad target")

// Target is the workload that runs one pool.
type Target struct {
	// Kind is KindDeployment or KindStatefulSet.
	Kind string
	// Name is the workload's name in the connector's namespace.
	Name string
}

func (t Target) String() string { return t.Kind + "/" + t.Name }

func (t Target) validate() error {
	if t.Kind != KindDeployment && t.Kind != KindStatefulSet {
		return fmt.Errorf("%w: kind %q is neither %s nor %s", ErrBadTarget, t.Kind, KindDeployment, KindStatefulSet)
	}
	if t.Name == "" {
		return fmt.Errorf("%w: %s without a name", ErrBadTarget, t.Kind)
	}
	return nil
}

// ParseTargets reads the --kube-targets syntax: comma-separated
// POOL=KIND/NAME, e.g. "prefill=Deployment/kvstrata-prefill,
// decode=Deployment/kvstrata-decode". Pools are prefill, decode and
// aggregated; each may appear once.
func ParseTargets(s string) (map[planner.Pool]Target, error) {
	out := map[planner.Pool]Target{}
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("%w: empty target list (want POOL=KIND/NAME,...)", ErrBadTarget)
	}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		pool, rest, ok := strings.Cut(item, "=")
		if !ok {
			return nil, fmt.Errorf("%w: %q is not POOL=KIND/NAME", ErrBadTarget, item)
		}
		p := planner.Pool(pool)
		switch p {
		case planner.Prefill, planner.Decode, planner.Aggregated:
		default:
			return nil, fmt.Errorf("%w: unknown pool %q (want prefill, decode or aggregated)", ErrBadTarget, pool)
		}
		if _, dup := out[p]; dup {
			return nil, fmt.Errorf("%w: pool %q named twice", ErrBadTarget, pool)
		}
		kind, name, ok := strings.Cut(rest, "/")
		if !ok {
			return nil, fmt.Errorf("%w: %q is not KIND/NAME", ErrBadTarget, rest)
		}
		t := Target{Kind: kind, Name: name}
		if err := t.validate(); err != nil {
			return nil, err
		}
		out[p] = t
	}
	return out, nil
}

// FormatTargets is ParseTargets' inverse, pools in name order.
func FormatTargets(ts map[planner.Pool]Target) string {
	pools := make([]string, 0, len(ts))
	for p := range ts {
		pools = append(pools, string(p))
	}
	sort.Strings(pools)
	parts := make([]string, len(pools))
	for i, p := range pools {
		parts[i] = p + "=" + ts[planner.Pool(p)].String()
	}
	return strings.Join(parts, ",")
}

// Connector scales pools' workloads in one namespace.
type Connector struct {
	cs      kubernetes.Interface
	ns      string
	targets map[planner.Pool]Target
}

var _ planner.Connector = (*Connector)(nil)

// New returns a Connector that scales targets in namespace through cs.
func New(cs kubernetes.Interface, namespace string, targets map[planner.Pool]Target) *Connector {
	ts := make(map[planner.Pool]Target, len(targets))
	for p, t := range targets {
		ts[p] = t
	}
	return &Connector{cs: cs, ns: namespace, targets: ts}
}

// NewFromKubeconfig builds the clientset from the kubeconfig file at path,
// or from the pod's service account when path is empty (in-cluster).
func NewFromKubeconfig(path, namespace string, targets map[planner.Pool]Target) (*Connector, error) {
	for p, t := range targets {
		if err := t.validate(); err != nil {
			return nil, fmt.Errorf("pool %s: %w", p, err)
		}
	}
	var cfg *rest.Config
	var err error
	if path == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", path)
	}
	if err != nil {
		return nil, fmt.Errorf("kube: client config: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kube: clientset: %w", err)
	}
	return New(cs, namespace, targets), nil
}

// Scale sets pool p's workload to n replicas through the scale
// subresource. It does nothing when the workload already asks for n, and
// retries once when someone else changed the workload between its read
// and its write (a Conflict).
func (c *Connector) Scale(ctx context.Context, p planner.Pool, n int) error {
	t, ok := c.targets[p]
	if !ok {
		return fmt.Errorf("%w %q", ErrUnknownPool, p)
	}
	if n < 0 {
		return fmt.Errorf("kube: scale %s to %d: negative", t, n)
	}
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		err = c.scaleOnce(ctx, t, int32(n))
		if !apierrors.IsConflict(err) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("kube: scale %s/%s to %d: %w", c.ns, t, n, err)
	}
	return nil
}

func (c *Connector) scaleOnce(ctx context.Context, t Target, n int32) error {
	s, err := c.getScale(ctx, t)
	if err != nil {
		return err
	}
	if s.Spec.Replicas == n {
		return nil
	}
	// The read resourceVersion stays in s: the update is refused with a
	// Conflict if the workload changed since.
	s.Spec.Replicas = n
	return c.updateScale(ctx, t, s)
}

func (c *Connector) getScale(ctx context.Context, t Target) (*autoscalingv1.Scale, error) {
	apps := c.cs.AppsV1()
	if t.Kind == KindStatefulSet {
		return apps.StatefulSets(c.ns).GetScale(ctx, t.Name, metav1.GetOptions{})
	}
	return apps.Deployments(c.ns).GetScale(ctx, t.Name, metav1.GetOptions{})
}

func (c *Connector) updateScale(ctx context.Context, t Target, s *autoscalingv1.Scale) error {
	apps := c.cs.AppsV1()
	var err error
	if t.Kind == KindStatefulSet {
		_, err = apps.StatefulSets(c.ns).UpdateScale(ctx, t.Name, s, metav1.UpdateOptions{})
	} else {
		_, err = apps.Deployments(c.ns).UpdateScale(ctx, t.Name, s, metav1.UpdateOptions{})
	}
	return err
}

// Replicas reads every target: Desired is the workload's spec.replicas
// (whoever set it: the planner or a person), Ready its
// status.readyReplicas.
func (c *Connector) Replicas(ctx context.Context) (map[planner.Pool]planner.Replicas, error) {
	out := make(map[planner.Pool]planner.Replicas, len(c.targets))
	apps := c.cs.AppsV1()
	for p, t := range c.targets {
		var spec *int32
		var ready int32
		switch t.Kind {
		case KindStatefulSet:
			s, err := apps.StatefulSets(c.ns).Get(ctx, t.Name, metav1.GetOptions{})
			if err != nil {
				return nil, fmt.Errorf("kube: get %s/%s: %w", c.ns, t, err)
			}
			spec, ready = s.Spec.Replicas, s.Status.ReadyReplicas
		default:
			d, err := apps.Deployments(c.ns).Get(ctx, t.Name, metav1.GetOptions{})
			if err != nil {
				return nil, fmt.Errorf("kube: get %s/%s: %w", c.ns, t, err)
			}
			spec, ready = d.Spec.Replicas, d.Status.ReadyReplicas
		}
		desired := 1 // the API server's default for an unset spec.replicas
		if spec != nil {
			desired = int(*spec)
		}
		out[p] = planner.Replicas{Desired: desired, Ready: int(ready)}
	}
	return out, nil
}
