# /etc/nomad.d/hadar.hcl: hadar's plugins on a GPU client (beside the
# client's own configuration in /etc/nomad.d). Every option:
# docs/driver.md. The plugins are the release archive's plugins/:
#   install -m 0755 hadar_<version>_linux_amd64/plugins/hadar-gpu \
#     hadar_<version>_linux_amd64/plugins/hadar-train /opt/nomad/plugins/
# Create data_dir with mode 0711 before the first start: hadar-train's
# tasks run as unprivileged uids that must reach their task directories.
data_dir   = "/opt/nomad/data"
plugin_dir = "/opt/nomad/plugins"

client {
  enabled = true
  meta {
    rack = "r1" # the node's rack, for network-aware placement (docs/placement.md)
  }
}

# Nomad loads a plugin of plugin_dir only when a plugin block names it.
plugin "hadar-gpu" {
  config {
    # empty: the node's NVIDIA GPUs through NVML (amd64 release)
  }
}

plugin "hadar-train" {
  config {
    checkpoint_root = "/srv/hadar/checkpoints"
  }
}
