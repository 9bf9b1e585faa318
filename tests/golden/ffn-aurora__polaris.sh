REFUSED: jobs/ffn-aurora.yaml:21: resources.threads_per_rank: 12 ranks x 8 threads = 96 per node, but a node of site 'polaris' has 32 cores x 2 threads = 64; lower ranks_per_node or threads_per_rank
