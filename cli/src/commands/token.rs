//! `tbctl token create`: a join token for a new nodelet (`tb-nodelet --join-token TOKEN`).
//!
//! Output contract: the token alone, on one line of stdout, so `TOKEN=$(tbctl token create)`
//! works; when it expires goes to stderr.

use anyhow::Result;
use tb_api::proto::CreateTokenRequest;

use super::Ctx;
use crate::args::TokenCommand;
use crate::output::emit;

pub async fn run(ctx: &mut Ctx, cmd: TokenCommand) -> Result<()> {
    match cmd {
        TokenCommand::Create { ttl, description } => {
            let resp = ctx
                .client()
                .create_token(CreateTokenRequest {
                    ttl_seconds: ttl,
                    description: description.unwrap_or_default(),
                })
                .await?;
            emit(&format!("{}\n", resp.token))?;
            eprintln!("token expires at {}", resp.expires_at);
            Ok(())
        }
    }
}
