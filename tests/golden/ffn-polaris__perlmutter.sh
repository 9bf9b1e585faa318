REFUSED: jobs/ffn-polaris.yaml:22: resources.queue: site 'perlmutter' has no queue 'debug'; did you mean 'gpu_debug'?
