//! Running commands: fail with the command's name, or exit with its own status.

use anyhow::{bail, Context, Result};
use std::process::Command;

/// Runs `cmd`; an error names it when it fails.
pub fn run(mut cmd: Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("could not start {cmd:?}"))?;
    if !status.success() {
        bail!(
            "{:?} {} failed ({status})",
            cmd.get_program(),
            cmd.get_args()
                .next()
                .map(|a| a.to_string_lossy())
                .unwrap_or_default()
        );
    }
    Ok(())
}

/// Runs a command that reports for itself, and exits with its status: a verdict table that
/// says "FAIL" needs no second error message from the xtask.
pub fn run_as_is(mut cmd: Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("could not start {cmd:?}"))?;
    if !status.success() {
        std::process::exit(status.code().unwrap_or(1));
    }
    Ok(())
}

/// Whether `program --version` runs.
pub fn has(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// [`run`] for a long build: cargo's lines pass through as they come, and where it says nothing
/// for [`QUIET`] (one crate compiling alone: tch's or the instrument's last crates take 20 s
/// and more on two cores), a line says the build goes on and for how long, so that a terminal
/// never shows a build that cannot be told from a hang.
pub fn run_built(mut cmd: Command, what: &str) -> Result<()> {
    if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        cmd.env("CARGO_TERM_COLOR", "always"); // piped through here, as colourful as before
    }
    run_heard(
        cmd,
        what,
        "still building",
        "the crates named last are compiling",
    )
}

/// [`run`] with a heartbeat: the command's lines (stdout and stderr) pass through as they come,
/// and after [`QUIET`] without one a line says `{what}: {doing}, N s so far ({why})`. pip says
/// nothing while it unpacks what it downloaded: torch's 4.6 GB kept a fresh machine's terminal
/// silent for 32.5 s (2026-12-07).
pub fn run_heard(mut cmd: Command, what: &str, doing: &str, why: &str) -> Result<()> {
    use std::io::{BufRead, BufReader, Read};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    const QUIET: Duration = Duration::from_secs(8);
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("could not start {cmd:?}"))?;
    let (lines, said) = mpsc::channel::<(bool, String)>();
    let pass = |from: Box<dyn Read + Send>, err: bool, lines: mpsc::Sender<(bool, String)>| {
        std::thread::spawn(move || {
            for line in BufReader::new(from).lines().map_while(|l| l.ok()) {
                if lines.send((err, line)).is_err() {
                    break;
                }
            }
        })
    };
    let readers = [
        pass(
            Box::new(child.stdout.take().expect("piped")),
            false,
            lines.clone(),
        ),
        pass(Box::new(child.stderr.take().expect("piped")), true, lines),
    ];
    let started = Instant::now();
    loop {
        match said.recv_timeout(QUIET) {
            Ok((true, line)) => eprintln!("{line}"),
            Ok((false, line)) => println!("{line}"),
            Err(mpsc::RecvTimeoutError::Timeout) => eprintln!(
                "leaklab: ── {what}: {doing}, {:.0} s so far ({why})",
                started.elapsed().as_secs_f64()
            ),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    for reader in readers {
        let _ = reader.join();
    }
    let status = child
        .wait()
        .with_context(|| format!("waiting for {cmd:?}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}
