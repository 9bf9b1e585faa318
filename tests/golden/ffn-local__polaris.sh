REFUSED: jobs/ffn-local.yaml:48: resources.account: site 'polaris' needs an account (allocation/project) to charge; set resources.account or the site's account
