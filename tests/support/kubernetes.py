"""The Kubernetes version manifests are validated against (kubernetes_validate's schemas)."""

K8S_VERSION = "1.30.0"
