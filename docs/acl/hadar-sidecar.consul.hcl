# Least privilege for the hadar sidecar in Consul (leader election with
# CONSUL_HTTP_ADDR set; docs/sidecar.md, "Several replicas"):
#
#   consul acl policy create -name hadar-sidecar -rules @docs/acl/hadar-sidecar.consul.hcl
#   consul acl token create -policy-name hadar-sidecar
#
# The lock key is leader.path (default hadar/sidecar/leader).
key_prefix "hadar/sidecar/" {
  policy = "write"
}

# Sessions hold the lock; they are created on the sidecar's node.
session_prefix "" {
  policy = "write"
}
