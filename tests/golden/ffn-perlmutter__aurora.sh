REFUSED: jobs/ffn-perlmutter.yaml:23: resources.queue: site 'aurora' has no queue 'gpu'; queues of aurora: debug, debug-scaling, prod, small, medium, large
