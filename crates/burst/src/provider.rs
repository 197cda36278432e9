//! The cloud API burst needs, and its EC2 implementation (aws-sdk-ec2).
//!
//! Instances are found by tags, never by memory: `kairos:cluster` (which cluster owns it) and
//! `kairos:intent` (which committed launch intent it realises). RunInstances also carries a
//! `ClientToken` derived from the intent; EC2 honours it for a while, moto not at all, so the
//! reconciler looks an intent up by tag before it ever retries a launch.
//!
//! Region, credentials and (for tests) the endpoint come from the standard AWS configuration
//! chain (`AWS_REGION`, `AWS_ACCESS_KEY_ID`, profiles, instance roles, `AWS_ENDPOINT_URL`…),
//! with an explicit endpoint override on top.

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{
    Filter, InstanceMarketOptionsRequest, InstanceStateName, InstanceType as Ec2InstanceType,
    LaunchTemplateSpecification, MarketType, ResourceType, SpotMarketOptions, Tag, TagSpecification,
};
use base64::Engine;
use thiserror::Error;

pub const CLUSTER_TAG: &str = "kairos:cluster";
pub const INTENT_TAG: &str = "kairos:intent";

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CloudError {
    /// The cloud has no capacity for this type/market now (try another, back off).
    #[error("no capacity: {0}")]
    Capacity(String),
    /// The cloud refused the request itself (e.g. an instance type it does not know).
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Other(String),
}

/// What the cloud says about an instance type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeInfo {
    pub name: String,
    pub gpus: u32,
    /// The GPU model name (e.g. "A10G", "H100"); empty when it has no GPU.
    pub gpu_model: String,
}

/// What one launch asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchSpec {
    pub cluster: String,
    pub intent: u64,
    pub instance_type: String,
    pub spot: bool,
    pub subnet: Option<String>,
    pub launch_template: String,
    /// The boot script (plain text; the provider encodes it).
    pub user_data: String,
    /// Spot only: the most the instance may cost per hour (milli-dollars), the price its launch
    /// was planned and limited with — so spend can never pass the limits when the spot price
    /// rises above it (the launch fails, or the instance is interrupted, instead).
    pub max_price_milli: Option<u64>,
}

impl LaunchSpec {
    /// Idempotency token of this intent (EC2 allows 64 ASCII characters).
    pub fn client_token(&self) -> String {
        let t = format!("kairos-{}-{}", self.cluster, self.intent);
        t.chars().take(64).collect()
    }
}

/// A tagged instance as the cloud reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloudInstance {
    pub id: String,
    /// The `kairos:intent` tag, when it parses.
    pub intent: Option<u64>,
    /// pending | running | shutting-down | terminated | stopping | stopped
    pub state: String,
    pub instance_type: String,
}

impl CloudInstance {
    /// Whether it is (or may become) a running, billed machine.
    pub fn is_alive(&self) -> bool {
        !matches!(self.state.as_str(), "shutting-down" | "terminated")
    }
}

/// The cloud operations burst uses.
#[allow(async_fn_in_trait)]
pub trait Cloud {
    /// Starts one instance; returns its id.
    async fn launch(&self, spec: &LaunchSpec) -> Result<String, CloudError>;
    /// Every instance tagged with `cluster` (any state the cloud still reports).
    async fn list(&self, cluster: &str) -> Result<Vec<CloudInstance>, CloudError>;
    async fn terminate(&self, ids: &[String]) -> Result<(), CloudError>;
    /// GPU count and model of each named instance type (`Invalid` when one does not exist).
    async fn instance_types(&self, names: &[String]) -> Result<Vec<TypeInfo>, CloudError>;
}

/// A dollar amount for EC2 (`MaxPrice`) from milli-dollars.
fn dollars(milli: u64) -> String {
    format!("{}.{:03}", milli / 1000, milli % 1000)
}

/// The market options of a launch: spot with its maximum price, or on-demand (`None`).
pub fn market_options(spec: &LaunchSpec) -> Option<InstanceMarketOptionsRequest> {
    if !spec.spot {
        return None;
    }
    let mut spot = SpotMarketOptions::builder();
    if let Some(milli) = spec.max_price_milli {
        spot = spot.max_price(dollars(milli));
    }
    Some(
        InstanceMarketOptionsRequest::builder()
            .market_type(MarketType::Spot)
            .spot_options(spot.build())
            .build(),
    )
}

/// EC2 through aws-sdk-ec2.
#[derive(Clone, Debug)]
pub struct Ec2Cloud {
    client: aws_sdk_ec2::Client,
}

/// Error codes EC2 answers when it has no capacity for a request right now.
const CAPACITY_CODES: &[&str] = &[
    "InsufficientInstanceCapacity",
    "InsufficientCapacity",
    "InsufficientHostCapacity",
    "InsufficientReservedInstanceCapacity",
    "SpotMaxPriceTooLow",
    "MaxSpotInstanceCountExceeded",
    "InsufficientFreeAddressesInSubnet",
    "Unsupported",
];

fn classify<E: ProvideErrorMetadata + std::error::Error + 'static>(
    e: aws_sdk_ec2::error::SdkError<E>,
) -> CloudError {
    let code = e.code().unwrap_or("").to_string();
    let message = e.message().unwrap_or("").to_string();
    if CAPACITY_CODES.contains(&code.as_str()) {
        return CloudError::Capacity(format!("{code}: {message}"));
    }
    if code == "InvalidInstanceType" {
        return CloudError::Invalid(message);
    }
    if code.is_empty() {
        // Transport or dispatch failure: no service answer at all.
        return CloudError::Other(format!("{}", aws_sdk_ec2::error::DisplayErrorContext(&e)));
    }
    CloudError::Other(format!("{code}: {message}"))
}

impl Ec2Cloud {
    /// A client for `region`, credentials from the standard chain, `endpoint` overriding the
    /// EC2 endpoint (tests: moto on loopback).
    pub async fn new(region: &str, endpoint: Option<&str>) -> Ec2Cloud {
        Ec2Cloud::with_credentials(region, endpoint, None).await
    }

    /// Like `new`, with static credentials (access key id, secret) instead of the chain's.
    pub async fn with_credentials(
        region: &str,
        endpoint: Option<&str>,
        keys: Option<(&str, &str)>,
    ) -> Ec2Cloud {
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        // A hung endpoint must not hang the reconciler: every call ends within these bounds
        // (the SDK's standard retry, with backoff, happens inside them).
        let timeouts = aws_config::timeout::TimeoutConfig::builder()
            .connect_timeout(std::time::Duration::from_secs(5))
            .operation_timeout(std::time::Duration::from_secs(30))
            .build();
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .http_client(http)
            .timeout_config(timeouts)
            .region(aws_config::Region::new(region.to_string()));
        if let Some(url) = endpoint {
            loader = loader.endpoint_url(url);
        }
        if let Some((id, secret)) = keys {
            let creds = aws_sdk_ec2::config::Credentials::new(id, secret, None, None, "kairos-static");
            loader = loader.credentials_provider(creds);
        }
        let conf = loader.load().await;
        Ec2Cloud { client: aws_sdk_ec2::Client::new(&conf) }
    }

    /// The decoded user-data of an instance (the burst "instance booter" in tests uses it the
    /// way cloud-init would).
    pub async fn user_data(&self, id: &str) -> Result<String, CloudError> {
        let out = self
            .client
            .describe_instance_attribute()
            .instance_id(id)
            .attribute(aws_sdk_ec2::types::InstanceAttributeName::UserData)
            .send()
            .await
            .map_err(classify)?;
        let encoded = out.user_data().and_then(|u| u.value()).unwrap_or("");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|e| CloudError::Other(format!("user-data is not base64: {e}")))?;
        String::from_utf8(bytes).map_err(|e| CloudError::Other(format!("user-data is not UTF-8: {e}")))
    }
}

impl Cloud for Ec2Cloud {
    async fn launch(&self, spec: &LaunchSpec) -> Result<String, CloudError> {
        let tags = TagSpecification::builder()
            .resource_type(ResourceType::Instance)
            .tags(Tag::builder().key(CLUSTER_TAG).value(&spec.cluster).build())
            .tags(Tag::builder().key(INTENT_TAG).value(spec.intent.to_string()).build())
            .tags(
                Tag::builder()
                    .key("Name")
                    .value(format!("kairos-{}-burst-{}", spec.cluster, spec.intent))
                    .build(),
            )
            .build();
        let template = if spec.launch_template.starts_with("lt-") {
            LaunchTemplateSpecification::builder().launch_template_id(&spec.launch_template)
        } else {
            LaunchTemplateSpecification::builder().launch_template_name(&spec.launch_template)
        };
        let mut req = self
            .client
            .run_instances()
            .min_count(1)
            .max_count(1)
            .instance_type(spec.instance_type.as_str().into())
            .launch_template(template.build())
            .client_token(spec.client_token())
            .user_data(base64::engine::general_purpose::STANDARD.encode(&spec.user_data))
            .tag_specifications(tags);
        if let Some(subnet) = &spec.subnet {
            req = req.subnet_id(subnet);
        }
        if let Some(market) = market_options(spec) {
            req = req.instance_market_options(market);
        }
        let out = req.send().await.map_err(classify)?;
        out.instances()
            .first()
            .and_then(|i| i.instance_id())
            .map(str::to_string)
            .ok_or_else(|| CloudError::Other("RunInstances returned no instance".into()))
    }

    async fn list(&self, cluster: &str) -> Result<Vec<CloudInstance>, CloudError> {
        let mut out = Vec::new();
        let mut pages = self
            .client
            .describe_instances()
            .filters(Filter::builder().name(format!("tag:{CLUSTER_TAG}")).values(cluster).build())
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(classify)?;
            for i in page.reservations().iter().flat_map(|r| r.instances()) {
                let Some(id) = i.instance_id() else { continue };
                let intent = i
                    .tags()
                    .iter()
                    .find(|t| t.key() == Some(INTENT_TAG))
                    .and_then(|t| t.value()?.parse().ok());
                let state =
                    i.state().and_then(|s| s.name()).map(InstanceStateName::as_str).unwrap_or("unknown");
                out.push(CloudInstance {
                    id: id.to_string(),
                    intent,
                    state: state.to_string(),
                    instance_type: i.instance_type().map(|t| t.as_str().to_string()).unwrap_or_default(),
                });
            }
        }
        Ok(out)
    }

    async fn instance_types(&self, names: &[String]) -> Result<Vec<TypeInfo>, CloudError> {
        let out = self
            .client
            .describe_instance_types()
            .set_instance_types(Some(names.iter().map(|n| Ec2InstanceType::from(n.as_str())).collect()))
            .send()
            .await
            .map_err(classify)?;
        Ok(out
            .instance_types()
            .iter()
            .map(|t| {
                let gpus = t.gpu_info().map(|g| g.gpus()).unwrap_or_default();
                TypeInfo {
                    name: t.instance_type().map(|n| n.as_str().to_string()).unwrap_or_default(),
                    gpus: gpus.iter().filter_map(|g| g.count()).map(|c| c.max(0) as u32).sum(),
                    gpu_model: gpus.first().and_then(|g| g.name()).unwrap_or_default().to_string(),
                }
            })
            .collect())
    }

    async fn terminate(&self, ids: &[String]) -> Result<(), CloudError> {
        if ids.is_empty() {
            return Ok(());
        }
        self.client
            .terminate_instances()
            .set_instance_ids(Some(ids.to_vec()))
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }
}

/// Checks the configured instance types against what the cloud says of them (`Cloud::
/// instance_types`): each must exist, with the configured GPU count and model (the model
/// compared without case). The message names the type and both values.
pub fn check_instance_types(
    configured: &[kairos_scheduler::burst::InstanceType],
    found: &[TypeInfo],
) -> Result<(), String> {
    for t in configured {
        let Some(f) = found.iter().find(|f| f.name == t.name) else {
            return Err(format!("instance_types.{}: the cloud does not know this instance type", t.name));
        };
        if f.gpus != t.gpus || !f.gpu_model.eq_ignore_ascii_case(&t.gpu_model) {
            return Err(format!(
                "instance_types.{}: the cloud says {} {} GPU(s), the configuration says {} {}",
                t.name,
                f.gpus,
                if f.gpu_model.is_empty() { "no" } else { &f.gpu_model },
                t.gpus,
                t.gpu_model
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod market_tests {
    use super::*;

    fn spec(spot: bool, max_price_milli: Option<u64>) -> LaunchSpec {
        LaunchSpec {
            cluster: "c".into(),
            intent: 1,
            instance_type: "g5.xlarge".into(),
            spot,
            subnet: None,
            launch_template: "t".into(),
            user_data: String::new(),
            max_price_milli,
        }
    }

    #[test]
    fn spot_launches_carry_the_planned_price_as_their_maximum() {
        let market = market_options(&spec(true, Some(2_505))).expect("spot");
        assert_eq!(market.market_type(), Some(&MarketType::Spot));
        assert_eq!(market.spot_options().and_then(|s| s.max_price()), Some("2.505"));
        assert_eq!(dollars(40), "0.040");
        assert!(market_options(&spec(false, None)).is_none(), "on-demand has no market options");
    }

    #[test]
    fn configured_types_must_match_the_cloud() {
        use kairos_scheduler::burst::InstanceType;
        let t = |name: &str, gpus, model: &str| InstanceType {
            name: name.into(),
            gpus,
            gpu_model: model.into(),
            hourly_price_milli: 1000,
            spot_price_milli: None,
            cpus: 0,
            memory_mib: 0,
        };
        let found = [TypeInfo { name: "g5.xlarge".into(), gpus: 1, gpu_model: "A10G".into() }];
        assert_eq!(check_instance_types(&[t("g5.xlarge", 1, "a10g")], &found), Ok(()));
        let e = check_instance_types(&[t("g5.xlarge", 4, "A10G")], &found).unwrap_err();
        assert!(e.contains("the cloud says 1 A10G GPU(s), the configuration says 4 A10G"), "{e}");
        let e = check_instance_types(&[t("g5.xlarge", 1, "H100")], &found).unwrap_err();
        assert!(e.contains("configuration says 1 H100"), "{e}");
        let e = check_instance_types(&[t("p9.huge", 1, "H100")], &found).unwrap_err();
        assert!(e.contains("p9.huge: the cloud does not know"), "{e}");
    }
}
