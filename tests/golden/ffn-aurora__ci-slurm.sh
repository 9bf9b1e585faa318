REFUSED: jobs/ffn-aurora.yaml:19: resources.nodes: 2 nodes requested but queue 'debug' of site 'ci-slurm' allows at most 1 (site profile 'ci-slurm'); lower --nodes or pick a larger queue
