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
  description = "Who may assume the controller role: service principals (ec2.amazonaws.com, for the controllers' instance profile) and IAM role or user ARNs (arn:aws:iam::ACCOUNT:role/NAME)."
  type        = list(string)
  default     = ["ec2.amazonaws.com"]

  validation {
    condition = length(var.controller_role_principals) > 0 && alltrue([
      for p in var.controller_role_principals :
      can(regex("\\.amazonaws\\.com$", p)) || can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:(role|user|root)", p))
    ])
    error_message = "controller_role_principals: each entry is a service principal (ec2.amazonaws.com) or an IAM ARN (arn:aws:iam::123456789012:role/NAME)."
  }
}

variable "agent_port" {
  description = "Port kairos-agent serves its log service on (the burst user-data's addr, 7101); opened to controller_cidrs."
  type        = number
  default     = 7101
}

variable "tags" {
  description = "Extra tags for every resource."
  type        = map(string)
  default     = {}
}
