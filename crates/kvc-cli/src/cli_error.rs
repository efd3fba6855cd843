//! The one error type of the `kvc` command and its exit codes.

use std::fmt;

/// Why a `kvc` command failed; printed as one line on stderr.
#[derive(Debug)]
pub enum CliError {
    /// Bad input: a corrupt or malformed file, wrong shapes, bad options. Exit status 2.
    Input(String),
    /// The environment failed us: a file could not be read or written. Exit status 1.
    Io(String),
}

impl CliError {
    /// Bad input, exit status 2.
    pub fn input(msg: impl fmt::Display) -> Self {
        CliError::Input(msg.to_string())
    }

    /// An I/O failure on `path`, exit status 1.
    pub fn io(path: &std::path::Path, err: std::io::Error) -> Self {
        CliError::Io(format!("{}: {err}", path.display()))
    }

    /// The process exit status for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Input(_) => 2,
            CliError::Io(_) => 1,
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Input(msg) | CliError::Io(msg) => f.write_str(msg),
        }
    }
}
