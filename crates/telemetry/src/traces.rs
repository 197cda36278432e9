//! Traces over OTLP (gRPC), configured by the standard variables: on when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set and
//! `OTEL_SDK_DISABLED` is not `true`; the exporter reads the other `OTEL_*` settings itself.
//!
//! One trace per job: the CLI's submit span travels to the controller in the W3C `traceparent`
//! header; the controller's submit span is stored with the job (`JobSpec::traceparent`, so it
//! crosses the Raft log and a failover); the scheduling pass that placed the job and the
//! agent's launch are its children; the job gets `TRACEPARENT` to join its own spans.
//! Without a provider every span is a no-op that still carries its parent's context, so the
//! trace continues through a daemon that does not export.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, Tracer};
use opentelemetry::{global, Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;

/// Whether this process exports spans (`init` installed a provider, not yet shut down). Without
/// one a span is only its parent's context carried on, so none is built: a submit makes two.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// The exporting provider of this process; flushes and stops at `shutdown` (or drop).
pub struct Traces {
    provider: Option<SdkTracerProvider>,
}

fn configured() -> bool {
    let set = |k: &str| std::env::var(k).is_ok_and(|v| !v.trim().is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// Starts exporting this process's spans as `service` when the environment asks for it. Call
/// inside the Tokio runtime (the gRPC exporter uses it).
pub fn init(service: &'static str) -> Traces {
    global::set_text_map_propagator(TraceContextPropagator::new());
    if !configured() {
        return Traces { provider: None };
    }
    let exporter = match opentelemetry_otlp::SpanExporter::builder().with_tonic().build() {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(error = %e, "OTLP trace export not started");
            return Traces { provider: None };
        }
    };
    let resource = opentelemetry_sdk::Resource::builder().with_service_name(service).build();
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
    global::set_tracer_provider(provider.clone());
    EXPORTING.store(true, Ordering::Release);
    Traces { provider: Some(provider) }
}

impl Traces {
    /// Exports what is buffered and stops.
    pub fn shutdown(&mut self) {
        if let Some(p) = self.provider.take() {
            let _ = p.force_flush();
            let _ = p.shutdown();
            // After the flush: a span still open ends (and is exported) as before.
            EXPORTING.store(false, Ordering::Release);
        }
    }
}

impl Drop for Traces {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The W3C `traceparent` of `cx` (None when it holds no valid span).
pub fn traceparent(cx: &Context) -> Option<String> {
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(cx, &mut carrier);
    carrier.remove("traceparent")
}

/// The context a `traceparent` value names (the empty context for a malformed one).
pub fn context_of(traceparent: &str) -> Context {
    let carrier = HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
    TraceContextPropagator::new().extract(&carrier)
}

/// Starts span `name` of this process's tracer as a child of `parent` (a root when there is
/// none), with `attributes`; the returned context holds it — end it with `end`.
pub fn start(name: &'static str, parent: &Context, attributes: Vec<KeyValue>) -> Context {
    start_at(name, parent, std::time::SystemTime::now(), attributes)
}

/// `start` for a span that began at `at` (work timed before it was known to belong to a job).
pub fn start_at(
    name: &'static str,
    parent: &Context,
    at: std::time::SystemTime,
    attributes: Vec<KeyValue>,
) -> Context {
    if !EXPORTING.load(Ordering::Acquire) {
        // What a no-op tracer's span would be: the parent's span context, carried on.
        return parent.clone();
    }
    let tracer = global::tracer("kairos");
    let span = tracer
        .span_builder(name)
        .with_start_time(at)
        .with_attributes(attributes)
        .start_with_context(&tracer, parent);
    parent.with_span(span)
}

/// Ends the span `cx` holds.
pub fn end(cx: &Context) {
    // Without a provider `cx` is its parent's: nothing of this process's to end.
    if EXPORTING.load(Ordering::Acquire) {
        cx.span().end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_round_trips_and_children_keep_their_trace() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let cx = context_of(tp);
        assert_eq!(traceparent(&cx).as_deref(), Some(tp));
        // Without an exporting provider a child is a no-op span that carries its parent on.
        let child = start("child", &cx, Vec::new());
        let child_tp = traceparent(&child).unwrap();
        assert!(child_tp.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "{child_tp}");
        end(&child);
        assert_eq!(traceparent(&context_of("garbage")), None);
    }
}
