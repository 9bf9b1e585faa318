REFUSED: jobs/ffn-perlmutter.yaml:23: resources.queue: site 'ci-slurm' has no queue 'gpu'; queues of ci-slurm: debug
