REFUSED: jobs/ffn-perlmutter.yaml:23: resources.queue: site 'ci-cluster' has no queue 'gpu'; queues of ci-cluster: cluster
