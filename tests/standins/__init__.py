"""Stand-ins for the cluster services the pipeline talks to, driven by the real clients over real sockets.

- `kube`: one in-memory Kubernetes API (WSGI app; served by pytest-httpserver or as an HTTPS thread).
- `dns`: a cluster DNS server (dnslib, UDP and TCP) answering from the API stand-in's Services and pods.
- `incluster`: a pod's service-account files and a server certificate for the API stand-in (trustme).
- `cluster`: all three started together on one address, and what a pod (or `docker run`) needs to join.
- `objects`: the API's selector and patch rules, as plain functions.
- `serving`: a werkzeug server thread (HTTP or HTTPS).
- `netns`: root-only network-namespace "pods" for tests that need a pod's resolver and a real pod IP.
"""
