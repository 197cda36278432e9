# kairos cloud burst: the launch template kairosd launches from, the security group of burst
# nodes (agent -> controllers gRPC; controllers -> the agent's log service, nothing else), the
# controllers' IAM role (launch only from this template, touch only instances tagged with this
# cluster), and the burst nodes' instance profile (no AWS permissions beyond reading their own
# instance metadata).

locals {
  tags = merge(var.tags, { "kairos:cluster" = var.cluster_name })
}

data "aws_caller_identity" "current" {}
data "aws_region" "current" {}

resource "aws_security_group" "burst_node" {
  name        = "kairos-${var.cluster_name}-burst-node"
  description = "kairos burst nodes: gRPC to the controllers, and from them to the agent only"
  vpc_id      = var.vpc_id
  tags        = local.tags

  # `kairos logs` of a job on a burst node: the controller connects to the agent's log service.
  ingress {
    description = "controllers to kairos-agent's log service (gRPC)"
    from_port   = var.agent_port
    to_port     = var.agent_port
    protocol    = "tcp"
    cidr_blocks = var.controller_cidrs
  }

  egress {
    description = "kairos-agent to the controllers (gRPC)"
    from_port   = var.controller_port
    to_port     = var.controller_port
    protocol    = "tcp"
    cidr_blocks = var.controller_cidrs
  }
}

resource "aws_launch_template" "burst" {
  name                   = "kairos-${var.cluster_name}-burst"
  description            = "kairos burst GPU node (kairosd passes the user-data that starts kairos-agent)"
  image_id               = var.gpu_ami_id
  update_default_version = true
  vpc_security_group_ids = [aws_security_group.burst_node.id]
  ebs_optimized          = true

  iam_instance_profile {
    arn = aws_iam_instance_profile.burst_node.arn
  }

  # IMDSv2 only (spot interruption notices are read through it), one hop: containers on the
  # node cannot reach it.
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "enabled"
  }

  block_device_mappings {
    device_name = "/dev/sda1"
    ebs {
      volume_size           = var.root_volume_gib
      volume_type           = "gp3"
      encrypted             = true
      kms_key_id            = var.kms_key_arn
      delete_on_termination = true
    }
  }

  monitoring {
    enabled = true
  }

  # kairosd replaces this with the per-instance script (controllers, node name, intent label);
  # this default only keeps a node launched by hand from joining anything.
  user_data = base64encode(templatefile("${path.module}/user_data.sh.tftpl", {
    cluster_name = var.cluster_name
  }))

  tag_specifications {
    resource_type = "instance"
    tags          = local.tags
  }

  tag_specifications {
    resource_type = "volume"
    tags          = local.tags
  }

  tags = local.tags
}

# Burst nodes: an instance profile without AWS permissions.
data "aws_iam_policy_document" "ec2_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "burst_node" {
  name               = "kairos-${var.cluster_name}-burst-node"
  assume_role_policy = data.aws_iam_policy_document.ec2_assume.json
  tags               = local.tags
}

resource "aws_iam_instance_profile" "burst_node" {
  name = "kairos-${var.cluster_name}-burst-node"
  role = aws_iam_role.burst_node.name
  tags = local.tags
}

# Controllers: launch only from this template, tag only at launch, and describe / terminate
# only instances tagged with this cluster.
data "aws_iam_policy_document" "controller_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    # Service principals (ec2.amazonaws.com: the controllers' instance profile) and IAM ARNs
    # (roles or users that run the controllers elsewhere); the variable refuses anything else.
    dynamic "principals" {
      for_each = length(local.service_principals) > 0 ? [1] : []
      content {
        type        = "Service"
        identifiers = local.service_principals
      }
    }
    dynamic "principals" {
      for_each = length(local.arn_principals) > 0 ? [1] : []
      content {
        type        = "AWS"
        identifiers = local.arn_principals
      }
    }
  }
}

locals {
  service_principals = [for p in var.controller_role_principals : p if can(regex("\\.amazonaws\\.com$", p))]
  arn_principals     = [for p in var.controller_role_principals : p if can(regex("^arn:aws[a-z-]*:iam::", p))]
}

locals {
  arn_prefix = "arn:aws:ec2:${data.aws_region.current.name}:${data.aws_caller_identity.current.account_id}"
}

data "aws_iam_policy_document" "controller" {
  #checkov:skip=CKV_AWS_356:ec2:DescribeInstances and DescribeInstanceTypes support no resource-level permissions; every other action is scoped
  statement {
    sid       = "RunFromTheBurstTemplateOnly"
    actions   = ["ec2:RunInstances"]
    resources = ["${local.arn_prefix}:launch-template/${aws_launch_template.burst.id}"]
  }

  statement {
    sid     = "RunInstancesResources"
    actions = ["ec2:RunInstances"]
    resources = [
      "${local.arn_prefix}:instance/*",
      "${local.arn_prefix}:volume/*",
      "${local.arn_prefix}:network-interface/*",
      "${local.arn_prefix}:subnet/*",
      "${local.arn_prefix}:security-group/${aws_security_group.burst_node.id}",
      "arn:aws:ec2:${data.aws_region.current.name}::image/${var.gpu_ami_id}",
    ]
    condition {
      test     = "ArnLike"
      variable = "ec2:LaunchTemplate"
      values   = ["${local.arn_prefix}:launch-template/${aws_launch_template.burst.id}"]
    }
  }

  statement {
    sid       = "TagOnlyAtLaunch"
    actions   = ["ec2:CreateTags"]
    resources = ["${local.arn_prefix}:instance/*", "${local.arn_prefix}:volume/*"]
    condition {
      test     = "StringEquals"
      variable = "ec2:CreateAction"
      values   = ["RunInstances"]
    }
  }

  statement {
    sid       = "TerminateOwnInstances"
    actions   = ["ec2:TerminateInstances"]
    resources = ["${local.arn_prefix}:instance/*"]
    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/kairos:cluster"
      values   = [var.cluster_name]
    }
  }

  statement {
    sid = "Describe"
    # Listing the cluster's instances (by tag) and checking the configured instance types'
    # GPUs. Neither supports resource-level permissions; nothing here reads an instance's
    # attributes (user-data holds the join token).
    actions   = ["ec2:DescribeInstances", "ec2:DescribeInstanceTypes"]
    resources = ["*"]
  }

  statement {
    sid       = "PassTheNodeRole"
    actions   = ["iam:PassRole"]
    resources = [aws_iam_role.burst_node.arn]
  }
}

resource "aws_iam_role" "controller" {
  name               = "kairos-${var.cluster_name}-controller"
  assume_role_policy = data.aws_iam_policy_document.controller_assume.json
  tags               = local.tags
}

resource "aws_iam_role_policy" "controller" {
  name   = "kairos-burst"
  role   = aws_iam_role.controller.id
  policy = data.aws_iam_policy_document.controller.json
}

resource "aws_iam_instance_profile" "controller" {
  name = "kairos-${var.cluster_name}-controller"
  role = aws_iam_role.controller.name
  tags = local.tags
}
