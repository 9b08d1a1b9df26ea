//! `weir credential`: a client's own credential, derived from the cluster secret and the role the
//! cluster's config gives the client's name. Hand it to whoever runs the client commands instead
//! of the cluster secret: it proves that name with that role and nothing more.

use std::path::PathBuf;

use anyhow::Context;
use weir_engine::wire::transport::client::Credential;

/// `weir credential`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Example:
  export WEIR_CREDENTIAL=$(weir credential --config examples/three-node.toml reader)
  weir status --cluster weir-three-node --node 127.0.0.1:7101

The config names each client and its role under [[clients]] (read: status, query, verify;
ingest: weir load; admin: read, stop, checkpoint-now). Exit codes: 0 printed, 2 an error (no
such client, no secret).")]
pub struct CredentialArgs {
    /// The client's name, as the config's [[clients]] lists it.
    pub name: String,
    /// The cluster's config file (it holds the secret and the clients' roles).
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// Print a JSON object (name, role, credential) instead of the bare credential.
    #[arg(long)]
    pub json: bool,
}

#[allow(clippy::print_stdout)]
pub fn run(args: &CredentialArgs) -> anyhow::Result<std::process::ExitCode> {
    let file = crate::config::load(&args.config, std::env::vars())?;
    file.validate().with_context(|| format!("in {}", args.config.display()))?;
    let roles = file.client_roles()?;
    let role = *roles.get(&args.name).with_context(|| {
        let mut names: Vec<&str> = roles.keys().map(String::as_str).collect();
        names.sort_unstable();
        format!("{} lists no client {:?} (its clients: {})", args.config.display(), args.name, names.join(", "))
    })?;
    let token = Credential::derive(&file.secret()?, &args.name, role).to_token().expect("a client credential");
    if args.json {
        let v = serde_json::json!({ "name": args.name, "role": role.name(), "credential": token });
        println!("{v}");
    } else {
        println!("{token}");
    }
    Ok(std::process::ExitCode::SUCCESS)
}
