package kube

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/kvstrata/kvstrata/planner"
)

// ErrBadSpec marks a Spec that Manifests cannot turn into a deployment.
var ErrBadSpec = errors.New("kube: bad spec")

// The ports the manifests give each process: the cache node's defaults
// (config.Default: gRPC 7070, data plane 7071, raft 7072, HTTP 9090), the
// worker's (8000, KV events 5557 and their replay 5558) and the
// frontend's (8080).
const (
	CacheGRPCPort = 7070
	CacheDataPort = 7071
	CacheRaftPort = 7072
	CacheHTTPPort = 9090
	WorkerPort    = 8000
	EventsPort    = 5557
	ReplayPort    = 5558
	FrontendPort  = 8080
)

// Spec describes a whole kvstrata deployment on Kubernetes. Zero fields
// take the defaults named.
type Spec struct {
	// Namespace of every object. The default is "kvstrata".
	Namespace string
	// Image is the container image with the kvstrata binary on its PATH
	// and a /bin/sh (the cache node takes its node id from its pod's
	// ordinal). The default is "kvstrata:latest".
	Image string
	// CacheNodes is the cache cluster's size, its raft voters. The default
	// is 3.
	CacheNodes int
	// CacheStorage is each cache node's volume for its data directory (raft
	// state and the SSD tier). The default is "10Gi".
	CacheStorage string
	// Prefill and Decode are the disaggregated pools' starting sizes;
	// Aggregated, if set, makes one aggregated pool instead (then Prefill
	// and Decode must be 0). The default is 1 prefill and 1 decode worker.
	Prefill, Decode, Aggregated int
	// CacheArgs, WorkerArgs, FrontendArgs and PlannerArgs are appended to
	// each process's flags (e.g. --dram-capacity=8GiB, --model=tiny,
	// --policy=kv-hbm, the planner's profile and targets).
	CacheArgs, WorkerArgs, FrontendArgs, PlannerArgs []string
	// NoPlanner leaves out the planner and its RBAC.
	NoPlanner bool
}

// Names of the objects Manifests makes.
const (
	CacheName    = "kvstrata-cache"
	FrontendName = "kvstrata-frontend"
	PlannerName  = "kvstrata-planner"
)

// WorkerName is the Deployment of a pool's workers: "kvstrata-prefill".
func WorkerName(p planner.Pool) string { return "kvstrata-" + string(p) }

func (s Spec) withDefaults() Spec {
	if s.Namespace == "" {
		s.Namespace = "kvstrata"
	}
	if s.Image == "" {
		s.Image = "kvstrata:latest"
	}
	if s.CacheNodes == 0 {
		s.CacheNodes = 3
	}
	if s.CacheStorage == "" {
		s.CacheStorage = "10Gi"
	}
	if s.Prefill == 0 && s.Decode == 0 && s.Aggregated == 0 {
		s.Prefill, s.Decode = 1, 1
	}
	return s
}

func (s Spec) validate() error {
	var probs []string
	if s.CacheNodes < 1 {
		probs = append(probs, fmt.Sprintf("CacheNodes %d: at least 1", s.CacheNodes))
	}
	if s.Prefill < 0 || s.Decode < 0 || s.Aggregated < 0 {
		probs = append(probs, fmt.Sprintf("negative workers (prefill %d, decode %d, aggregated %d)", s.Prefill, s.Decode, s.Aggregated))
	}
	if s.Aggregated > 0 && (s.Prefill > 0 || s.Decode > 0) {
		probs = append(probs, "Aggregated excludes Prefill and Decode: one topology or the other")
	}
	if _, err := resource.ParseQuantity(s.CacheStorage); err != nil {
		probs = append(probs, fmt.Sprintf("CacheStorage %q: %v", s.CacheStorage, err))
	}
	if len(probs) > 0 {
		return fmt.Errorf("%w: %s", ErrBadSpec, strings.Join(probs, "; "))
	}
	return nil
}

// Pools are the worker pools of the spec, in the order they are made.
func (s Spec) Pools() []planner.Pool {
	s = s.withDefaults()
	if s.Aggregated > 0 {
		return []planner.Pool{planner.Aggregated}
	}
	return []planner.Pool{planner.Prefill, planner.Decode}
}

// Targets are the planner's --kube-targets for the spec's pools.
func (s Spec) Targets() map[planner.Pool]Target {
	ts := map[planner.Pool]Target{}
	for _, p := range s.Pools() {
		ts[p] = Target{Kind: KindDeployment, Name: WorkerName(p)}
	}
	return ts
}

func podLabels(component string) map[string]string {
	return map[string]string{"app.kubernetes.io/name": "kvstrata", "app.kubernetes.io/component": component}
}

func meta(s Spec, name, component string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: s.Namespace, Labels: podLabels(component)}
}

// podEnv gives a container its pod's name, IP and namespace, which the
// arguments use as $(POD_NAME), $(POD_IP) and $(POD_NAMESPACE).
func podEnv() []corev1.EnvVar {
	field := func(name, path string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
	}
	return []corev1.EnvVar{field("POD_NAME", "metadata.name"), field("POD_IP", "status.podIP"), field("POD_NAMESPACE", "metadata.namespace")}
}

func port(name string, n int32) corev1.ContainerPort {
	return corev1.ContainerPort{Name: name, ContainerPort: n, Protocol: corev1.ProtocolTCP}
}

func httpProbe(path string, p int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(p)}},
		PeriodSeconds: 5,
	}
}

// cacheHost is cache node i's DNS name through the headless Service.
func cacheHost(s Spec, i int) string {
	return fmt.Sprintf("%s-%d.%s.%s.svc.cluster.local", CacheName, i, CacheName, s.Namespace)
}

// CacheAddr is the cache cluster's gRPC address for clients in the
// namespace: the headless Service's name, which resolves to every node.
func CacheAddr() string { return fmt.Sprintf("%s:%d", CacheName, CacheGRPCPort) }

// CacheShell starts a cache node with its node id, the pod's ordinal + 1,
// then the container's arguments ("$@").
const CacheShell = `exec kvstrata serve --node-id="$((${HOSTNAME##*-} + 1))" "$@"`

func cache(s Spec) []runtime.Object {
	peers := make([]string, s.CacheNodes)
	for i := range peers {
		peers[i] = fmt.Sprintf("%d=%s:%d", i+1, cacheHost(s, i), CacheRaftPort)
	}
	args := []string{
		"--data-dir=/data",
		"--cluster-name=$(POD_NAME)",
		fmt.Sprintf("--listen-grpc=$(POD_IP):%d", CacheGRPCPort),
		fmt.Sprintf("--listen-data=$(POD_IP):%d", CacheDataPort),
		fmt.Sprintf("--listen-http=0.0.0.0:%d", CacheHTTPPort),
		// What the node tells its peers and clients: its stable DNS name
		// through the headless Service, never the wildcard it listens on.
		fmt.Sprintf("--advertise-host=$(POD_NAME).%s.$(POD_NAMESPACE).svc.cluster.local", CacheName),
		"--listen-resp=",
		fmt.Sprintf("--cluster-raft-addr=$(POD_NAME).%s.$(POD_NAMESPACE).svc.cluster.local:%d", CacheName, CacheRaftPort),
		"--cluster-bootstrap=" + strings.Join(peers, ","),
		// The pods listen on their network without TLS and authentication:
		// the cluster's network is trusted. Give them tls.* and
		// auth.users-file (docs/security.md) and drop this flag where it
		// is not.
		"--insecure-allow-remote",
	}
	args = append(args, s.CacheArgs...)
	svc := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: meta(s, CacheName, "cache"),
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone,
			// The nodes must find each other to elect a leader, before
			// any of them is ready.
			PublishNotReadyAddresses: true,
			Selector:                 podLabels("cache"),
			Ports: []corev1.ServicePort{
				{Name: "grpc", Port: CacheGRPCPort, TargetPort: intstr.FromString("grpc")},
				{Name: "data", Port: CacheDataPort, TargetPort: intstr.FromString("data")},
				{Name: "raft", Port: CacheRaftPort, TargetPort: intstr.FromString("raft")},
				{Name: "http", Port: CacheHTTPPort, TargetPort: intstr.FromString("http")},
			},
		},
	}
	replicas := int32(s.CacheNodes)
	sts := &appsv1.StatefulSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "StatefulSet"},
		ObjectMeta: meta(s, CacheName, "cache"),
		Spec: appsv1.StatefulSetSpec{
			ServiceName: CacheName,
			Replicas:    &replicas,
			// Every voter of the bootstrap list starts at once.
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Selector:            &metav1.LabelSelector{MatchLabels: podLabels("cache")},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels("cache")},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name:           "cache",
					Image:          s.Image,
					Command:        []string{"/bin/sh", "-c", CacheShell, "kvstrata"},
					Args:           args,
					Env:            podEnv(),
					Ports:          []corev1.ContainerPort{port("grpc", CacheGRPCPort), port("data", CacheDataPort), port("raft", CacheRaftPort), port("http", CacheHTTPPort)},
					ReadinessProbe: httpProbe("/readyz", CacheHTTPPort),
					VolumeMounts:   []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
				}}},
			},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{
				TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
				ObjectMeta: metav1.ObjectMeta{Name: "data"},
				Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
						corev1.ResourceStorage: resource.MustParse(s.CacheStorage),
					}},
				},
			}},
		},
	}
	return []runtime.Object{svc, sts}
}

func workload(s Spec, name, component string, replicas int, c corev1.Container, sa string) *appsv1.Deployment {
	n := int32(replicas)
	c.Image = s.Image
	c.Env = podEnv()
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: meta(s, name, component),
		Spec: appsv1.DeploymentSpec{
			Replicas: &n,
			Selector: &metav1.LabelSelector{MatchLabels: podLabels(component)},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels(component)},
				Spec:       corev1.PodSpec{ServiceAccountName: sa, Containers: []corev1.Container{c}},
			},
		},
	}
}

func workers(s Spec, p planner.Pool, n int) runtime.Object {
	args := []string{
		"worker",
		"--role=" + string(p),
		fmt.Sprintf("--listen=0.0.0.0:%d", WorkerPort),
		"--cache=" + CacheAddr(),
		fmt.Sprintf("--kv-events=tcp://0.0.0.0:%d", EventsPort),
		fmt.Sprintf("--kv-events-replay=tcp://0.0.0.0:%d", ReplayPort),
		"--register",
		fmt.Sprintf("--advertise-url=http://$(POD_IP):%d", WorkerPort),
	}
	return workload(s, WorkerName(p), string(p), n, corev1.Container{
		Name:           "worker",
		Command:        []string{"kvstrata"},
		Args:           append(args, s.WorkerArgs...),
		Ports:          []corev1.ContainerPort{port("http", WorkerPort), port("events", EventsPort), port("replay", ReplayPort)},
		ReadinessProbe: httpProbe("/health", WorkerPort),
	}, "")
}

func frontend(s Spec) []runtime.Object {
	args := []string{
		"frontend",
		fmt.Sprintf("--listen=0.0.0.0:%d", FrontendPort),
		"--discover",
		"--cache=" + CacheAddr(),
	}
	d := workload(s, FrontendName, "frontend", 1, corev1.Container{
		Name:           "frontend",
		Command:        []string{"kvstrata"},
		Args:           append(args, s.FrontendArgs...),
		Ports:          []corev1.ContainerPort{port("http", FrontendPort)},
		ReadinessProbe: httpProbe("/health", FrontendPort),
	}, "")
	svc := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: meta(s, FrontendName, "frontend"),
		Spec: corev1.ServiceSpec{
			Selector: podLabels("frontend"),
			Ports:    []corev1.ServicePort{{Name: "http", Port: FrontendPort, TargetPort: intstr.FromString("http")}},
		},
	}
	return []runtime.Object{svc, d}
}

// PlannerRules are the planner's permissions: read the workloads, and
// read and change their scale subresource.
func PlannerRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"apps"}, Resources: []string{"deployments", "statefulsets"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments/scale", "statefulsets/scale"}, Verbs: []string{"get", "update", "patch"}},
	}
}

func plannerObjects(s Spec) []runtime.Object {
	sa := &corev1.ServiceAccount{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
		ObjectMeta: meta(s, PlannerName, "planner"),
	}
	role := &rbacv1.Role{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
		ObjectMeta: meta(s, PlannerName, "planner"),
		Rules:      PlannerRules(),
	}
	binding := &rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
		ObjectMeta: meta(s, PlannerName, "planner"),
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: PlannerName},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: PlannerName, Namespace: s.Namespace}},
	}
	args := []string{"planner", "--connector=kube", "--kube-targets=" + FormatTargets(s.Targets())}
	d := workload(s, PlannerName, "planner", 1, corev1.Container{
		Name:    "planner",
		Command: []string{"kvstrata"},
		Args:    append(args, s.PlannerArgs...),
	}, PlannerName)
	return []runtime.Object{sa, role, binding, d}
}

//go:generate go test -run TestGolden -update .

// Manifests makes every object of the deployment s describes: the cache
// StatefulSet and its headless Service, the worker Deployments, the
// frontend Deployment and Service, and the planner's Deployment,
// ServiceAccount, Role and RoleBinding.
func Manifests(s Spec) ([]runtime.Object, error) {
	s = s.withDefaults()
	if err := s.validate(); err != nil {
		return nil, err
	}
	objs := cache(s)
	if s.Aggregated > 0 {
		objs = append(objs, workers(s, planner.Aggregated, s.Aggregated))
	} else {
		objs = append(objs, workers(s, planner.Prefill, s.Prefill), workers(s, planner.Decode, s.Decode))
	}
	objs = append(objs, frontend(s)...)
	if !s.NoPlanner {
		objs = append(objs, plannerObjects(s)...)
	}
	return objs, nil
}

// WriteYAML writes objs as one YAML stream, documents separated by "---".
func WriteYAML(w io.Writer, objs []runtime.Object) error {
	var buf bytes.Buffer
	buf.WriteString("# kvstrata on Kubernetes, generated by kube.Manifests (planner/connector/kube).\n")
	for i, o := range objs {
		b, err := yaml.Marshal(o)
		if err != nil {
			return fmt.Errorf("kube: object %d: %w", i, err)
		}
		buf.WriteString("---\n")
		buf.Write(b)
	}
	_, err := w.Write(buf.Bytes())
	return err
}
