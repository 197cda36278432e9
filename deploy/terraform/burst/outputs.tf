output "launch_template_name" {
  description = "Put this in the burst configuration (launch_template)."
  value       = aws_launch_template.burst.name
}

output "launch_template_id" {
  description = "The launch template id (lt-...), also accepted as launch_template."
  value       = aws_launch_template.burst.id
}

output "security_group_id" {
  description = "Security group of burst nodes."
  value       = aws_security_group.burst_node.id
}

output "controller_instance_profile" {
  description = "Instance profile for the controller hosts (RunInstances from the template, Terminate/Describe own instances)."
  value       = aws_iam_instance_profile.controller.name
}

output "controller_role_arn" {
  description = "The controllers' IAM role."
  value       = aws_iam_role.controller.arn
}
