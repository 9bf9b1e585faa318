REFUSED: jobs/ffn-frontier.yaml:24: resources.queue: site 'aurora' has no queue 'batch'; queues of aurora: debug, debug-scaling, prod, small, medium, large
