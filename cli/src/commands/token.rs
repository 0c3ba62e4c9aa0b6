//! `tbctl token create`: a join token for a new nodelet (`tb-nodelet --join-token-file FILE`),
//! single use unless `--uses N`, bound to one node name with `--node NAME`.
//!
//! Output contract: the token alone, on one line of stdout, so `tbctl token create > FILE`
//! works; when it expires, how many joins it allows and its node go to stderr.

use anyhow::Result;
use tb_api::proto::CreateTokenRequest;

use super::Ctx;
use crate::args::TokenCommand;
use crate::output::emit;

pub async fn run(ctx: &mut Ctx, cmd: TokenCommand) -> Result<()> {
    match cmd {
        TokenCommand::Create {
            ttl,
            uses,
            node,
            description,
        } => {
            if let Some(n) = &node {
                tb_api::name::validate_name(n).map_err(|e| anyhow::anyhow!("--node: {e}"))?;
            }
            let resp = ctx
                .client()
                .create_token(CreateTokenRequest {
                    ttl_seconds: ttl,
                    description: description.unwrap_or_default(),
                    uses,
                    node: node.unwrap_or_default(),
                })
                .await?;
            emit(&format!("{}\n", resp.token))?;
            let joins = match resp.uses {
                1 => "one join".to_string(),
                n => format!("{n} joins"),
            };
            let node = if resp.node.is_empty() {
                String::new()
            } else {
                format!(
                    ", only as node {} (replacing it if it joined before)",
                    resp.node
                )
            };
            eprintln!("token expires at {}; {joins}{node}", resp.expires_at);
            Ok(())
        }
    }
}
