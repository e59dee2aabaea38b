[[- /* The job's name: job_name, the pack's name when empty. */ -]]
[[- define "job_name" -]]
[[- if eq (var "job_name" .) "" -]][[ meta "pack.name" . ]][[- else -]][[ var "job_name" . ]][[- end -]]
[[- end -]]
