variable "cluster_name" {
  description = "The kairos cluster name: kairosd --cluster-name, and the kairos:cluster tag of every burst instance."
  type        = string
}

variable "vpc_id" {
  description = "VPC the burst instances run in."
  type        = string
}

variable "gpu_ami_id" {
  description = "GPU AMI with NVIDIA drivers and kairos-agent installed (kairosd's user-data starts the agent)."
  type        = string
}

variable "controller_cidrs" {
  description = "CIDR blocks of the kairos controllers: the only destination burst agents may reach (gRPC)."
  type        = list(string)
}

variable "controller_port" {
  description = "Port the controllers serve gRPC on."
  type        = number
  default     = 7001
}

variable "kms_key_arn" {
  description = "KMS key for the instances' root volumes (null: the account's default EBS key)."
  type        = string
  default     = null
}

variable "root_volume_gib" {
  description = "Root volume size of a burst instance."
  type        = number
  default     = 200
}

variable "controller_role_principals" {
  description = "AWS principals (e.g. the controllers' instance role ARNs or an EC2 service principal) allowed to assume the controller role."
  type        = list(string)
  default     = ["ec2.amazonaws.com"]
}

variable "tags" {
  description = "Extra tags for every resource."
  type        = map(string)
  default     = {}
}
