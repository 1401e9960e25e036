//! `bin/Runner.Listener` of the fake runner package: see [`rm_fake_runner::listener_main`].

fn main() -> std::process::ExitCode {
    rm_fake_runner::listener_main()
}
