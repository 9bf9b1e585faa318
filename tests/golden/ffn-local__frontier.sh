REFUSED: jobs/ffn-local.yaml:48: resources.account: site 'frontier' needs an account (allocation/project) to charge; set resources.account or the site's account
