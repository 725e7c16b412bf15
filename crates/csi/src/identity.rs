//! The CSI Identity service: the plugin's name and version, what it offers, readiness.

use tonic::{Request, Response, Status};

use crate::pb::{self, plugin_capability};
use crate::Mode;

pub struct Identity {
    pub mode: Mode,
}

#[tonic::async_trait]
impl pb::identity_server::Identity for Identity {
    async fn get_plugin_info(
        &self,
        _: Request<pb::GetPluginInfoRequest>,
    ) -> Result<Response<pb::GetPluginInfoResponse>, Status> {
        Ok(Response::new(pb::GetPluginInfoResponse {
            name: crate::DRIVER_NAME.to_string(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<pb::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<pb::GetPluginCapabilitiesResponse>, Status> {
        let mut capabilities = Vec::new();
        if self.mode != Mode::Node {
            capabilities.push(pb::PluginCapability {
                r#type: Some(plugin_capability::Type::Service(plugin_capability::Service {
                    r#type: plugin_capability::service::Type::ControllerService as i32,
                })),
            });
            // A bigger claim only changes the recorded size: no node needs to act.
            capabilities.push(pb::PluginCapability {
                r#type: Some(plugin_capability::Type::VolumeExpansion(plugin_capability::VolumeExpansion {
                    r#type: plugin_capability::volume_expansion::Type::Online as i32,
                })),
            });
        }
        Ok(Response::new(pb::GetPluginCapabilitiesResponse { capabilities }))
    }

    async fn probe(&self, _: Request<pb::ProbeRequest>) -> Result<Response<pb::ProbeResponse>, Status> {
        Ok(Response::new(pb::ProbeResponse { ready: Some(true) }))
    }
}
