# What Prometheus needs to scrape hadar (docs/observability.md): the
# sidecar's /metrics count the whole cluster's GPUs by rack, so under the
# status API's nomad_auth they ask for node read.
#
#   nomad acl policy apply -description "Prometheus: hadar's metrics" prometheus docs/acl/prometheus.nomad.hcl
#   nomad acl token create -name prometheus -policy prometheus -type client
#   nomad var put nomad/jobs/prometheus hadar_token=<the token's Secret ID>
#
# deploy/prometheus/prometheus.nomad.hcl finds the replicas with its
# workload identity (services of its own namespace). A Prometheus that uses
# nomad_sd_configs with this token instead needs, as well:
#
#   namespace "default" { capabilities = ["read-job"] }

node {
  policy = "read"
}
