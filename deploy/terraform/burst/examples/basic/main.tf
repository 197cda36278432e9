# A burst module for cluster "prod" in an existing VPC; controllers at 10.0.1.0/24.
provider "aws" {
  region = "us-east-1"
}

module "kairos_burst" {
  source           = "../.."
  cluster_name     = "prod"
  vpc_id           = "vpc-0123456789abcdef0"
  gpu_ami_id       = "ami-0123456789abcdef0"
  controller_cidrs = ["10.0.1.0/24"]
  tags             = { team = "ml-platform" }
}

output "launch_template" {
  value = module.kairos_burst.launch_template_name
}
