package kube

import (
	_ "k8s.io/apimachinery/pkg/runtime/serializer"
	_ "k8s.io/client-go/kubernetes/fake"
	_ "k8s.io/client-go/kubernetes/scheme"
	_ "k8s.io/client-go/testing"
	_ "sigs.k8s.io/yaml"
)
