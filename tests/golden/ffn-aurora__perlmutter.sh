REFUSED: jobs/ffn-aurora.yaml:24: resources.queue: site 'perlmutter' has no queue 'debug'; did you mean 'gpu_debug'?
