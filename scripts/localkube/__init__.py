"""A real local Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)
on loopback, plus a small node agent that runs pods as local processes; used by the end-to-end tests.

See docs/local-kube.md. Entry point: ``scripts/local-kube`` (build / up / down / status / pin).
"""
