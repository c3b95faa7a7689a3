//go:build tools

// The commands `make k8s` builds; this file only keeps them in go.mod's module graph.
package k8s

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
