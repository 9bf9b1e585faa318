REFUSED: jobs/ffn-aurora.yaml:24: resources.queue: site 'ci-cluster' has no queue 'debug'; queues of ci-cluster: cluster
