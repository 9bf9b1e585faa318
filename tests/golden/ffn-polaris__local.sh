REFUSED: jobs/ffn-polaris.yaml:22: resources.queue: site 'local' has no queues, but queue 'debug' was asked for; remove resources.queue for this site
