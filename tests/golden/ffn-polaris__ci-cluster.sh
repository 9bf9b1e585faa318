REFUSED: jobs/ffn-polaris.yaml:22: resources.queue: site 'ci-cluster' has no queue 'debug'; queues of ci-cluster: cluster
