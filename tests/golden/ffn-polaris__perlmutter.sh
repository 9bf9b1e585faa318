REFUSED: resources.queue: site 'perlmutter' has no queue 'debug'; did you mean 'gpu_debug'?
