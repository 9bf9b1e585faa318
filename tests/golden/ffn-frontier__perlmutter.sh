REFUSED: jobs/ffn-frontier.yaml:24: resources.queue: site 'perlmutter' has no queue 'batch'; queues of perlmutter: gpu, gpu_debug, cpu, cpu_debug
