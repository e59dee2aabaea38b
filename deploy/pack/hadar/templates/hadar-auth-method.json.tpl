{
  "JWKSURL": [[ printf "%s/.well-known/jwks.json" (trimSuffix "/" (var "cluster_address" .)) | toJson ]],
  "BoundAudiences": ["nomadproject.io"],
  "ClaimMappings": {
    "nomad_namespace": "nomad_namespace",
    "nomad_job_id": "nomad_job_id",
    "nomad_task": "nomad_task"
  }
}
