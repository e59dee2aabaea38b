app {
  url = "https://github.com/hadar-sched/hadar"
}

pack {
  name        = "hadar"
  description = "The hadar sidecar: two replicas, one leading, authenticated by workload identity (docs/deploy.md)."
  version     = "0.3.0"
}
