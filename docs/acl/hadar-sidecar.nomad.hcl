# Least privilege for the hadar sidecar (docs/sidecar.md, "Least privilege").
#
#   nomad acl policy apply -description "hadar sidecar" hadar-sidecar docs/acl/hadar-sidecar.nomad.hcl
#   nomad acl token create -name hadar-sidecar -policy hadar-sidecar -type client
#
# Replace "training" by the namespaces where your managed jobs run (one
# block each): the only namespaces the sidecar may write jobs in. The
# sidecar itself writes only jobs carrying hadar.* meta; this policy makes
# Nomad enforce the namespace boundary as well.

# Read every job and allocation: GPUs that jobs hadar does not manage hold
# are capacity it must not plan on.
namespace "*" {
  capabilities = ["list-jobs", "read-job"]
}

namespace "training" {
  # Rewrite managed jobs (placement, eviction) and read training progress
  # from the allocation filesystem.
  capabilities = ["list-jobs", "read-job", "submit-job", "read-fs"]

  # The state store and the leader lock (state.store = "nomad",
  # leader.enabled = true), under their default paths; the namespace must
  # match state.namespace and leader.namespace.
  variables {
    path "hadar/sidecar/*" {
      capabilities = ["read", "write", "list", "destroy"]
    }
  }
}

# Nodes, their GPUs, racks and drains.
node {
  policy = "read"
}
