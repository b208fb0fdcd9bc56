package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kvstrata/kvstrata/planner/connector/kube"
)

// podValues stand for what Kubernetes puts into $(VAR) references of a
// container's arguments.
var podValues = strings.NewReplacer("$(POD_NAME)", "kvstrata-cache-0", "$(POD_IP)", "10.0.0.7", "$(POD_NAMESPACE)", "kvstrata")

// Every container of the generated manifests (deploy/kvstrata.yaml is
// their golden copy) runs a kvstrata command with flags that command has:
// the command line is parsed as the binary parses it, with --help, which
// refuses unknown flags before it prints anything.
func TestManifestsRunFlagsTheCommandsHave(t *testing.T) {
	// The check is not vacuous: a flag the command lacks fails it.
	var out, errOut bytes.Buffer
	if code := execute(context.Background(), []string{"worker", "--kv-events-bind=tcp://0.0.0.0:5557", "--help"}, &out, &errOut); code == 0 {
		t.Fatal("worker --kv-events-bind (a frontend's flag) --help exits 0")
	}
	for _, spec := range []kube.Spec{{}, {Aggregated: 2, WorkerArgs: []string{"--model=tiny", "--max-num-seqs=64"}},
		// what kvstrata configure --write-k8s writes
		{Prefill: 1, Decode: 3, WorkerArgs: []string{"--max-num-seqs=16", "--max-num-batched-tokens=8192", "--num-gpu-blocks=8192"}}} {
		objs, err := kube.Manifests(spec)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			var pod corev1.PodSpec
			switch w := o.(type) {
			case *appsv1.Deployment:
				pod = w.Spec.Template.Spec
			case *appsv1.StatefulSet:
				pod = w.Spec.Template.Spec
			default:
				continue
			}
			for _, c := range pod.Containers {
				line := containerLine(t, c)
				var out, errOut bytes.Buffer
				code := execute(context.Background(), append(line, "--help"), &out, &errOut)
				if code != 0 {
					t.Errorf("container %s: kvstrata %s: exit %d:\n%s", c.Name, strings.Join(line, " "), code, errOut.String())
				}
			}
		}
	}
}

// containerLine is commandLine without the slicing trick: the subcommand
// and flags the container's kvstrata runs.
func containerLine(t *testing.T, c corev1.Container) []string {
	t.Helper()
	var line []string
	switch {
	case len(c.Command) == 1 && c.Command[0] == "kvstrata":
	case len(c.Command) == 4 && c.Command[0] == "/bin/sh" && c.Command[2] == kube.CacheShell:
		line = []string{"serve", "--node-id=1"}
	default:
		t.Fatalf("container %s runs %q, not kvstrata", c.Name, c.Command)
	}
	for _, a := range c.Args {
		line = append(line, podValues.Replace(a))
	}
	return line
}

// The cache node's command line is a valid configuration, not only known
// flags: serve --print-config checks every value.
func TestManifestsCacheNodeConfigurationIsValid(t *testing.T) {
	objs, err := kube.Manifests(kube.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		sts, ok := o.(*appsv1.StatefulSet)
		if !ok {
			continue
		}
		line := containerLine(t, sts.Spec.Template.Spec.Containers[0])
		var out, errOut bytes.Buffer
		os.Unsetenv("KVSTRATA_CONFIG")
		if code := execute(context.Background(), append(line, "--print-config"), &out, &errOut); code != 0 {
			t.Fatalf("kvstrata %s --print-config: exit %d:\n%s", strings.Join(line, " "), code, errOut.String())
		}
		for _, want := range []string{"kvstrata-cache-1.kvstrata-cache.kvstrata.svc.cluster.local:7072", "10.0.0.7:7070"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("the effective configuration does not say %s:\n%s", want, out.String())
			}
		}
	}
}
