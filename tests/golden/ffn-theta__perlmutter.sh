REFUSED: jobs/ffn-theta.yaml:25: resources.queue: site 'perlmutter' has no queue 'default'; queues of perlmutter: gpu, gpu_debug, cpu, cpu_debug
