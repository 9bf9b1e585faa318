REFUSED: jobs/ffn-theta.yaml:25: resources.queue: site 'aurora' has no queue 'default'; queues of aurora: debug, debug-scaling, prod, small, medium, large
