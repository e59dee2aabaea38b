# /etc/hadar/sidecar.hcl: the sidecar under systemd (hadar-sidecar.service),
# outside Nomad. Every setting: docs/sidecar.md, "Configuration".
nomad {
  address = "http://127.0.0.1:4646" # or https:// with ca_cert
  # A token of the hadar-sidecar ACL policy (docs/deploy.md, step 4),
  # read on every request: replace the file to rotate it.
  token_file = "/etc/hadar/nomad-token"
}

namespaces = ["*"]
policy     = "hadar"
placement  = "delay"
round      = "6m"

http {
  # Loopback: read it through an SSH tunnel, or give tls_cert and
  # tls_key to listen beyond this machine (docs/status.md, "Security").
  address = "127.0.0.1:4650"
}

# The state in the unit's StateDirectory. With several replicas on
# several machines, share it in Nomad Variables instead (store = "nomad")
# and turn on the leader block (docs/sidecar.md, "Several replicas").
state {
  store = "file"
  path  = "/var/lib/hadar/sidecar.db"
}
