//! A command per record (`-- CMD`), at most `-j` at once.

use std::sync::atomic::Ordering;

use crate::args::Args;
use crate::progress::Counts;
use crate::read::trim;

/// The commands run per record, at most `jobs` at once.
pub(crate) struct Commands {
    program: String,
    args: Vec<String>,
    jobs: usize,
    running: tokio::task::JoinSet<bool>,
    failed: u64,
}

impl Commands {
    pub(crate) fn new(args: &Args) -> Option<Commands> {
        let (program, rest) = args.command.split_first()?;
        Some(Commands {
            program: program.clone(),
            args: rest.to_vec(),
            jobs: args.jobs,
            running: tokio::task::JoinSet::new(),
            failed: 0,
        })
    }

    /// Starts the command for `record`, once fewer than `jobs` run.
    pub(crate) async fn start(&mut self, record: Vec<u8>, separator: u8, counts: &Counts) {
        while self.running.len() >= self.jobs {
            self.reap_one(counts).await;
        }
        let text = String::from_utf8_lossy(trim(&record, separator)).into_owned();
        let substituted = self.args.iter().any(|arg| arg.contains("{}"));
        let mut command = tokio::process::Command::new(&self.program);
        if substituted {
            command.args(self.args.iter().map(|arg| arg.replace("{}", &text)));
            command.stdin(std::process::Stdio::null());
        } else {
            command.args(&self.args);
            command.stdin(std::process::Stdio::piped());
        }
        counts.commands.fetch_add(1, Ordering::Relaxed);
        let program = self.program.clone();
        match command.spawn() {
            Ok(mut child) => {
                let input = (!substituted).then(|| child.stdin.take()).flatten();
                self.running.spawn(async move {
                    if let Some(mut stdin) = input {
                        use tokio::io::AsyncWriteExt;
                        let _ = stdin.write_all(&record).await;
                        drop(stdin);
                    }
                    child.wait().await.is_ok_and(|status| status.success())
                });
            }
            Err(error) => {
                eprintln!("paceline: cannot run {program}: {error}");
                self.failed += 1;
                counts.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    async fn reap_one(&mut self, counts: &Counts) {
        if let Some(done) = self.running.join_next().await
            && !done.unwrap_or(false)
        {
            self.failed += 1;
            counts.failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Waits for every command; how many failed.
    pub(crate) async fn finish(&mut self, counts: &Counts) -> u64 {
        while !self.running.is_empty() {
            self.reap_one(counts).await;
        }
        self.failed
    }
}
