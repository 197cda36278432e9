//! kairosd: the controller daemon. Its flags and wiring are `kairos_server::daemon`; the
//! services and loops the rest of `kairos_server`.

#[tokio::main]
async fn main() {
    if let Err(e) = kairos_server::daemon::run().await {
        eprintln!("kairosd: {e:#}");
        std::process::exit(1);
    }
}
