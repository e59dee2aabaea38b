# The hadar pack's variables: those of deploy/hadar-sidecar.nomad.hcl, and
# job_name, cluster_address, status_nomad_auth and queues.

variable "namespace" {
  description = "The namespace the sidecar job runs in (the -namespace of `nomad acl policy apply -job`)."
  type        = string
  default     = "default"
}

variable "datacenters" {
  type    = list(string)
  default = ["*"]
}

variable "node_pool" {
  type    = string
  default = "default"
}

variable "count" {
  description = "Replicas; one leads, the others follow. A leader stopped by Nomad releases the lock: another leads within about 2 s. One that dies (SIGKILL, a lost node) is replaced about 2 x lock_ttl + lock_delay later."
  type        = number
  default     = 2
}

variable "hadar_binary" {
  description = "Path of the hadar binary on the clients (raw_exec runs it as it is)."
  type        = string
  default     = "/usr/local/bin/hadar"
}

variable "hadar_artifact" {
  description = "Instead of hadar_binary: a URL of the release archive (hadar_<version>_linux_<arch>.tar.gz) for Nomad to fetch, with ?checksum=sha256:<hex>. Empty: use hadar_binary."
  type        = string
  default     = ""
}

variable "nomad_address" {
  description = "Nomad's HTTP API as the sidecar reaches it. Empty: the HTTP API of the client agent the replica runs on (http://<its advertise address>), which forwards to the servers; give https://... with nomad_ca_cert where the API uses TLS."
  type        = string
  default     = ""
}

variable "nomad_ca_cert" {
  description = "CA bundle (a path on the clients) to verify Nomad's HTTPS API with; empty: none."
  type        = string
  default     = ""
}

variable "user" {
  description = "The user the sidecar runs as (raw_exec): it needs no privilege on the node."
  type        = string
  default     = "nobody"
}

variable "state_namespace" {
  description = "Namespace of the sidecar's Nomad Variables (state and leader lock): one whose variables the ACL policy lets it write."
  type        = string
  default     = "training"
}

variable "watch_namespaces" {
  description = "Namespaces whose managed jobs the sidecar plans."
  type        = list(string)
  default     = ["*"]
}

variable "policy" {
  type    = string
  default = "hadar"
}

variable "round" {
  type    = string
  default = "6m"
}

variable "lock_ttl" {
  type    = string
  default = "15s"
}

variable "lock_delay" {
  description = "How long Nomad keeps the leader lock from being taken again after its holder's lease lapsed (a released lock is free at once)."
  type        = string
  default     = "15s"
}

variable "status_tls_cert" {
  description = "PEM certificate (a path on the clients) for HTTPS on the status API; empty: plain HTTP on the node's address, callers authenticated with Nomad ACL tokens."
  type        = string
  default     = ""
}

variable "status_tls_key" {
  type    = string
  default = ""
}

variable "extra_config" {
  description = "More sidecar configuration (HCL, docs/sidecar.md), appended as it is: gpu_types, placement, min_run_time, ..."
  type        = string
  default     = ""
}

variable "auth_method" {
  description = "The Nomad JWT auth method the sidecar logs in to with its workload identity, for an ACL token (deploy/hadar-auth-method.json; Nomad up to 1.11.3 refuses a workload identity for planning a job). Empty: the identity itself is the token."
  type        = string
  default     = "hadar-workload"
}

variable "identity_ttl" {
  description = "Lifetime of the sidecar's workload identity token; Nomad renews it at about half of it, and the sidecar reads each renewal from its secrets."
  type        = string
  default     = "1h"
}

variable "job_name" {
  description = "The sidecar job's name (the -job of `nomad acl policy apply` and the binding rule's selector)."
  type        = string
  default     = "hadar-sidecar"
}

variable "cluster_address" {
  description = "Nomad's HTTP API as the servers reach it (scheme, host, port): the auth method's JWKS URL is this plus /.well-known/jwks.json (the rendered hadar-auth-method.json). Any port: not only 4646."
  type        = string
  default     = "http://127.0.0.1:4646"
}

variable "status_nomad_auth" {
  description = "The status API takes Nomad ACL tokens, each seeing the namespaces it may read. false: no authentication (loopback only, or status_auth_token)."
  type        = bool
  default     = true
}

variable "queues" {
  description = "The queues block (docs/queues.md): queue \"name\" { ... } blocks, as HCL. Empty: one policy over every job."
  type        = string
  default     = ""
}
