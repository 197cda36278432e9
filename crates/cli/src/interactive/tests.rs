//! The interactive commands' command lines, the session client's resume bookkeeping, and the
//! specs and lines `alloc` makes.

use kairos_proto::v1 as pb;

use super::forward::parse_ports;
use super::stream::Ledger;

fn parse(argv: &[&str]) -> Result<crate::Cli, clap::Error> {
    crate::parse_cli(argv.iter().map(std::ffi::OsString::from))
}

fn chunk(offset: u64, data: &[u8]) -> pb::SessionOutputChunk {
    pb::SessionOutputChunk { offset, data: data.to_vec(), stderr: false }
}

#[test]
fn ports_are_remote_or_local_colon_remote() {
    assert_eq!(parse_ports("8888"), Ok((8888, 8888)));
    assert_eq!(parse_ports("9000:8888"), Ok((9000, 8888)));
    assert_eq!(parse_ports(":8888"), Ok((0, 8888)), "an empty LOCAL picks a free port");
    assert_eq!(parse_ports("65535:1"), Ok((65535, 1)));
}

#[test]
fn bad_ports_are_refused_saying_what_a_port_is() {
    for bad in ["0", "65536", "http", "9000:", "9000:0", "x:8888", "", "1:2:3", "-1"] {
        let err = parse_ports(bad).expect_err(bad);
        assert!(err.contains("is not a port (1-65535)") && err.contains("[LOCAL:]REMOTE"), "{bad}: {err}");
    }
}

#[test]
fn port_forward_parses_and_a_bad_port_is_a_usage_error() {
    let cli = parse(&["kairos", "port-forward", "12", "9000:8888", "--address", "0.0.0.0"]).expect("parses");
    let crate::Cmd::PortForward(a) = cli.command else { panic!("not port-forward") };
    assert_eq!((a.id, a.ports, a.address.as_str()), ((12, None), (9000, 8888), "0.0.0.0"));
    let cli = parse(&["kairos", "port-forward", "12", "8888"]).expect("parses");
    let crate::Cmd::PortForward(a) = cli.command else { panic!("not port-forward") };
    assert_eq!((a.ports, a.address.as_str()), ((8888, 8888), "127.0.0.1"));
    let err = parse(&["kairos", "port-forward", "12", "99999"]).expect_err("a port past 65535");
    assert!(err.to_string().contains("is not a port"), "{err}");
}

#[test]
fn exec_takes_a_pty_flag_a_keep_alive_and_needs_a_command() {
    let cli =
        parse(&["kairos", "exec", "7", "-t", "--keep-alive", "5m", "--", "bash", "-l"]).expect("parses");
    let crate::Cmd::Exec(a) = cli.command else { panic!("not exec") };
    assert_eq!((a.id, a.pty, a.keep_alive), ((7, None), true, Some(300)));
    assert_eq!(a.command, ["bash", "-l"]);
    let cli = parse(&["kairos", "exec", "7_2", "--", "nvidia-smi"]).expect("parses");
    let crate::Cmd::Exec(a) = cli.command else { panic!("not exec") };
    assert_eq!((a.id, a.pty), ((7, Some(2)), false), "pipes unless --pty");
    assert!(parse(&["kairos", "exec", "7"]).is_err(), "exec without a command");
}

#[test]
fn alloc_run_and_notebook_take_submits_resource_flags() {
    let argv = [
        "kairos",
        "alloc",
        "-G",
        "2",
        "-c",
        "8",
        "--mem",
        "16G",
        "-t",
        "1h",
        "-p",
        "dev",
        "-q",
        "interactive",
        "-A",
        "vision",
        "--gpu-model",
        "H100",
        "--keep-alive",
        "30m",
    ];
    let crate::Cmd::Alloc(a) = parse(&argv).expect("parses").command else { panic!("not alloc") };
    let s = &a.submit;
    assert_eq!((s.gpus, s.cpus_per_task, s.mem, s.time), (2, Some(8), Some(16 * 1024), Some(3600)));
    assert_eq!(
        (s.partition.as_deref(), s.qos.as_deref(), s.account.as_deref()),
        (Some("dev"), Some("interactive"), Some("vision"))
    );
    assert_eq!(
        (s.gpu_model.as_deref(), a.keep_alive, s.command.is_empty()),
        (Some("H100"), Some(1800), true)
    );
    let run = ["kairos", "run", "-G", "1", "--pty", "--", "python", "train.py"];
    let crate::Cmd::Run(r) = parse(&run).expect("parses").command else { panic!("not run") };
    assert_eq!(
        (r.pty, r.submit.gpus, r.submit.command.as_slice()),
        (true, 1, &["python".to_string(), "train.py".into()][..])
    );
    let nb = ["kairos", "notebook", "-G", "1", "--port", "9999", "--local-port", "8000"];
    let crate::Cmd::Notebook(n) = parse(&nb).expect("parses").command else { panic!("not notebook") };
    assert_eq!((n.port, n.local_port), (9999, Some(8000)));
    let crate::Cmd::Notebook(n) = parse(&["kairos", "notebook"]).expect("parses").command else { panic!() };
    assert_eq!((n.port, n.local_port), (8888, None));
    assert!(parse(&["kairos", "notebook", "--port", "0"]).is_err(), "port 0");
}

#[test]
fn an_interactive_spec_is_profile_interactive_with_a_login_shell_by_default() {
    let crate::Cmd::Alloc(a) = parse(&["kairos", "alloc", "-G", "1"]).expect("parses").command else {
        panic!()
    };
    let spec = super::alloc::interactive_spec(a.submit, Some(600), "interactive").expect("a spec");
    assert_eq!(spec.profile, pb::Profile::Interactive as i32);
    assert_eq!((spec.keep_alive_s, spec.name.as_str()), (600, "interactive"));
    assert_eq!(spec.argv, super::alloc::LOGIN_SHELL);
    let argv = ["kairos", "alloc", "--", "python", "-i"];
    let crate::Cmd::Alloc(a) = parse(&argv).expect("parses").command else { panic!() };
    let spec = super::alloc::interactive_spec(a.submit, None, "interactive").expect("a spec");
    assert_eq!(
        (spec.argv.as_slice(), spec.name.as_str(), spec.keep_alive_s),
        (&["python".to_string(), "-i".into()][..], "python", 0)
    );
    let crate::Cmd::Alloc(a) = parse(&["kairos", "alloc", "--array", "0-3"]).expect("parses").command else {
        panic!()
    };
    let err = super::alloc::interactive_spec(a.submit, None, "interactive").expect_err("no arrays");
    assert!(err.to_string().contains("--array"), "{err}");
}

#[test]
fn the_waiting_line_says_why_and_when() {
    let mut job = pb::Job { id: 41, reason: "Resources".into(), ..Default::default() };
    assert_eq!(
        super::alloc::waiting_line(&job),
        "kairos: job 41 queued; waiting (Resources, no start estimate yet)"
    );
    job.start_reason = "no node has 8 free GPUs".into();
    assert!(
        super::alloc::waiting_line(&job).ends_with("(Resources, no start estimate: no node has 8 free GPUs)")
    );
    job.expected_start_ms = 1_800_000_000_000;
    let line = super::alloc::waiting_line(&job);
    assert!(line.starts_with("kairos: job 41 queued; waiting (Resources, expected start 20"), "{line}");
}

#[test]
fn replayed_output_below_the_offset_is_never_written_twice() {
    let mut l = Ledger::default();
    assert_eq!(l.take(&chunk(0, b"hello ")), b"hello ");
    assert_eq!(l.take(&chunk(6, b"world")), b"world");
    assert_eq!(l.offset, 11);
    // A resumed stream replays from an earlier offset: only the new bytes come through.
    assert_eq!(l.take(&chunk(0, b"hello ")), b"");
    assert_eq!(l.take(&chunk(6, b"world!\n")), b"!\n");
    assert_eq!(l.offset, 13);
    // Bytes the agent no longer held are skipped, the offset moves past them.
    assert_eq!(l.take(&chunk(20, b"xy")), b"xy");
    assert_eq!(l.offset, 22);
}

#[test]
fn unacked_stdin_is_resent_in_order_and_acked_chunks_are_not() {
    let mut l = Ledger::default();
    let seqs: Vec<u64> = [&b"a"[..], b"b", b"c"].iter().map(|d| l.stdin(d.to_vec(), false).seq).collect();
    assert_eq!(seqs, [1, 2, 3]);
    l.acked(1);
    let resend: Vec<(u64, Vec<u8>)> = l.unacked().map(|c| (c.seq, c.data.clone())).collect();
    assert_eq!(resend, [(2, b"b".to_vec()), (3, b"c".to_vec())]);
    let eof = l.stdin(Vec::new(), true);
    assert_eq!((eof.seq, eof.eof), (4, true));
    // A new stream's `opened` says what the agent applied: those are dropped too.
    let lost = l.opened(&pb::SessionOpened {
        session: "s1".into(),
        input_seq: 3,
        output_offset: 0,
        ..Default::default()
    });
    assert_eq!(lost, 0);
    assert_eq!(l.unacked().map(|c| c.seq).collect::<Vec<_>>(), [4]);
    l.acked(9);
    assert_eq!(l.unacked().count(), 0);
}

#[test]
fn a_resumed_open_names_the_session_and_the_offset_held() {
    let base = pb::SessionOpen {
        job_id: 5,
        kind: pb::SessionKind::Exec as i32,
        argv: vec!["sh".into()],
        ..Default::default()
    };
    let mut l = Ledger::default();
    let first = l.open(&base);
    assert_eq!((first.resume.as_str(), first.output_offset), ("", 0), "a first open resumes nothing");
    l.opened(&pb::SessionOpened { session: "exec-5-0-1".into(), ..Default::default() });
    l.take(&chunk(0, b"12345"));
    let again = l.open(&base);
    assert_eq!((again.resume.as_str(), again.output_offset, again.job_id), ("exec-5-0-1", 5, 5));
    // The agent's buffer moved past us: the gap is reported and skipped.
    let lost =
        l.opened(&pb::SessionOpened { session: "exec-5-0-1".into(), output_offset: 9, ..Default::default() });
    assert_eq!((lost, l.offset), (4, 9));
}

#[test]
fn exit_status_is_the_code_or_128_plus_the_signal() {
    let exit = |code, signal| pb::SessionExit { code, signal, reason: String::new() };
    assert_eq!(super::exit_status(&exit(0, 0)), 0);
    assert_eq!(super::exit_status(&exit(3, 0)), 3);
    assert_eq!(super::exit_status(&exit(-1, 2)), 130);
    assert_eq!(super::exit_status(&exit(-1, 9)), 137);
    assert_eq!(super::exit_status(&exit(-1, 0)), 1, "ended other than by its command");
}

#[test]
fn the_jupyter_launch_keeps_the_token_off_the_command_line() {
    let argv = super::notebook::jupyter_argv(8890);
    assert_eq!(argv[..2], ["/bin/sh", "-c"]);
    assert!(argv[2].contains("jupyter lab --no-browser --ip=127.0.0.1 --port=8890"), "{}", argv[2]);
    assert!(argv[2].contains("--ServerApp.token=\"$JUPYTER_TOKEN\""), "{}", argv[2]);
}
