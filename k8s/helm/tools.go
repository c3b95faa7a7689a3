//go:build tools

// The command `make k8s` builds from this module; this file only keeps it in go.mod's module graph.
package helm

import _ "helm.sh/helm/v4/cmd/helm"
