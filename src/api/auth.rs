//! etcd's Auth service, and how every other service learns who calls it.
//!
//! [`caller`]: a request's `token` metadata (or `authorization`, with or
//! without `Bearer `, as etcd's gateway sends it) names the caller; a token
//! this member does not accept is refused ("invalid auth token") even while
//! auth is off, as etcd does. Without a token, with `--client-cert-auth`, a
//! verified client certificate's CommonName is the user. Otherwise the caller
//! is nobody, which is refused at the first check while auth is on.
//!
//! Management calls are checked here first (a `root` user, or oneself for
//! UserGet and one's own roles for RoleGet), so that nobody else gets a
//! password hashed or an answer; apply checks changes again against the store
//! as it stands when they commit. Reads of the store are linearizable (a read
//! barrier, then the applied store), as etcd serves them through its log.

use std::sync::Arc;

use tokio_rustls::rustls::pki_types::CertificateDer;

use tonic::{Request, Response, Status};

use super::{error, header};
use crate::model::auth::{AuthCommand, Caller, PermKind, Permission};
use crate::node::Node;
use crate::proto::authpb;
use crate::proto::etcdserverpb as pb;
use crate::proto::etcdserverpb::auth_server::{Auth, AuthServer};

/// Who sent `req` (see the module doc).
pub async fn caller<T>(node: &Node, req: &Request<T>) -> Result<Caller, Status> {
    Credentials::of(req).caller(node).await
}

/// What a request presents to say who it is: kept by streams, which look
/// again at each request they carry (a token may time out meanwhile, or the
/// store change).
#[derive(Clone, Default)]
pub struct Credentials {
    token: Option<String>,
    /// The verified client certificate chain, parsed only when its
    /// CommonName names the user (`--client-cert-auth`, auth on).
    certs: Option<Arc<Vec<CertificateDer<'static>>>>,
}

impl Credentials {
    pub fn of<T>(req: &Request<T>) -> Credentials {
        let md = req.metadata();
        let token = md.get("token").or_else(|| md.get("authorization")).and_then(|v| v.to_str().ok());
        if let Some(token) = token {
            let token = token.strip_prefix("Bearer ").unwrap_or(token).to_string();
            return Credentials { token: Some(token), certs: None };
        }
        Credentials { token: None, certs: req.peer_certs() }
    }

    pub async fn caller(&self, node: &Node) -> Result<Caller, Status> {
        if let Some(token) = &self.token {
            return node.identify(token).await.map_err(error::write);
        }
        let named = match &self.certs {
            Some(certs) if node.names_users_by_certificate() => certs.first().and_then(|c| common_name(c.as_ref())),
            _ => None,
        };
        Ok(named.map(|user| Caller { user, revision: Caller::CURRENT }).unwrap_or_default())
    }
}

fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?.as_str().ok()?.to_string();
    Some(cn)
}

/// Refuse `caller` unless it may do a `kind` operation on `[key, range_end)`.
pub fn check(node: &Node, caller: &Caller, key: &[u8], range_end: &[u8], kind: PermKind) -> Result<(), Status> {
    node.state().auth().check(caller, key, range_end, kind).map_err(error::auth)
}

/// Refuse `caller` unless it may both read and write `[key, range_end)`.
pub fn check_read_write(
    node: &Node,
    caller: &Caller,
    key: &[u8],
    range_end: &[u8],
) -> Result<(), crate::model::auth::AuthError> {
    let auth = node.state().auth();
    auth.check(caller, key, range_end, PermKind::Read)?;
    auth.check(caller, key, range_end, PermKind::Write)
}

/// Refuse `caller` unless it may read and write every key under `prefix`
/// (what a lock or election on a name needs: READ and WRITE on `name/`).
pub fn check_prefix(node: &Node, caller: &Caller, prefix: &[u8]) -> Result<(), crate::model::auth::AuthError> {
    check_read_write(node, caller, prefix, &crate::locks::prefix_end(prefix))
}

/// Refuse `caller` unless it may write every key attached to lease `id`:
/// who ties a key to a lease must be able to write the lease's other keys
/// (else the lease's holder could no longer keep it alive or revoke it).
pub fn check_lease(node: &Node, caller: &Caller, id: i64) -> Result<(), crate::model::auth::AuthError> {
    let state = node.state();
    let (leases, auth) = (state.leases(), state.auth());
    crate::model::auth::checks::check_lease_keys(&auth, caller, id, &leases)
}

/// Refuse `caller` unless it is a `root` user (while auth is on).
pub fn check_admin(node: &Node, caller: &Caller) -> Result<(), Status> {
    node.state().auth().check_admin(caller).map_err(error::auth)
}

/// The caller of `req`, refused unless it is a `root` user.
pub async fn admin<T>(node: &Node, req: &Request<T>) -> Result<Caller, Status> {
    let caller = caller(node, req).await?;
    check_admin(node, &caller)?;
    Ok(caller)
}

/// As [`admin`], refusing as etcd's Maintenance service does: the auth
/// package's error (or the token's), code Unknown.
pub async fn maintenance_admin<T>(node: &Node, req: &Request<T>) -> Result<(), Status> {
    let caller = Credentials::of(req)
        .caller(node)
        .await
        .map_err(|_| error::unchecked_auth(crate::model::auth::AuthError::InvalidToken))?;
    node.state().auth().check_admin(&caller).map_err(error::unchecked_auth)
}

pub struct AuthService {
    node: Arc<Node>,
}

impl AuthService {
    pub fn server(node: Arc<Node>) -> super::served::Served<AuthServer<AuthService>> {
        super::served::Served(
            AuthServer::new(AuthService { node })
                .max_decoding_message_size(crate::base::limits::MAX_GRPC_MESSAGE_BYTES),
        )
    }

    /// Apply an auth change for an admin caller; the header's revision.
    async fn change<T>(&self, req: &Request<T>, cmd: AuthCommand) -> Result<Option<pb::ResponseHeader>, Status> {
        let caller = admin(&self.node, req).await?;
        self.apply(cmd, &caller).await
    }

    async fn apply(&self, cmd: AuthCommand, caller: &Caller) -> Result<Option<pb::ResponseHeader>, Status> {
        let revision = self.node.change_auth(cmd, caller).await.map_err(error::write)?;
        Ok(header(&self.node, revision))
    }

    /// The caller, once this member has applied everything committed when
    /// the request arrived.
    async fn reader<T>(&self, req: &Request<T>) -> Result<Caller, Status> {
        self.node.read_barrier().await.map_err(error::server)?;
        // Identified after the barrier, as a Range is (see `kv`).
        caller(&self.node, req).await
    }
}

fn perm_kind(t: i32) -> PermKind {
    match authpb::permission::Type::try_from(t) {
        Ok(authpb::permission::Type::Write) => PermKind::Write,
        Ok(authpb::permission::Type::Readwrite) => PermKind::ReadWrite,
        _ => PermKind::Read,
    }
}

fn perm_type(k: PermKind) -> i32 {
    (match k {
        PermKind::Read => authpb::permission::Type::Read,
        PermKind::Write => authpb::permission::Type::Write,
        PermKind::ReadWrite => authpb::permission::Type::Readwrite,
    }) as i32
}

#[tonic::async_trait]
impl Auth for AuthService {
    async fn auth_enable(
        &self,
        req: Request<pb::AuthEnableRequest>,
    ) -> Result<Response<pb::AuthEnableResponse>, Status> {
        let header = self.change(&req, AuthCommand::Enable).await?;
        Ok(Response::new(pb::AuthEnableResponse { header }))
    }

    async fn auth_disable(
        &self,
        req: Request<pb::AuthDisableRequest>,
    ) -> Result<Response<pb::AuthDisableResponse>, Status> {
        let header = self.change(&req, AuthCommand::Disable).await?;
        Ok(Response::new(pb::AuthDisableResponse { header }))
    }

    async fn auth_status(
        &self,
        req: Request<pb::AuthStatusRequest>,
    ) -> Result<Response<pb::AuthStatusResponse>, Status> {
        let caller = self.reader(&req).await?;
        check_admin(&self.node, &caller)?;
        let auth = self.node.state().auth();
        let (enabled, auth_revision) = (auth.enabled, auth.revision);
        drop(auth);
        let header = header(&self.node, self.node.revision());
        Ok(Response::new(pb::AuthStatusResponse { header, enabled, auth_revision }))
    }

    async fn authenticate(
        &self,
        req: Request<pb::AuthenticateRequest>,
    ) -> Result<Response<pb::AuthenticateResponse>, Status> {
        let from = req.remote_addr().map(|a| a.ip());
        let req = req.into_inner();
        let (token, revision) = self.node.authenticate(req.name, req.password, from).await.map_err(error::write)?;
        Ok(Response::new(pb::AuthenticateResponse { header: header(&self.node, revision), token }))
    }

    async fn user_add(
        &self,
        req: Request<pb::AuthUserAddRequest>,
    ) -> Result<Response<pb::AuthUserAddResponse>, Status> {
        let caller = admin(&self.node, &req).await?;
        let req = req.into_inner();
        let no_password = req.options.is_some_and(|o| o.no_password);
        let password = match no_password {
            true => None,
            false => Some(self.node.hash_password(req.password).await.map_err(error::write)?),
        };
        let header = self.apply(AuthCommand::UserAdd { name: req.name, password }, &caller).await?;
        Ok(Response::new(pb::AuthUserAddResponse { header }))
    }

    async fn user_get(
        &self,
        req: Request<pb::AuthUserGetRequest>,
    ) -> Result<Response<pb::AuthUserGetResponse>, Status> {
        let caller = self.reader(&req).await?;
        let name = req.into_inner().name;
        if name != caller.user {
            check_admin(&self.node, &caller)?;
        }
        let auth = self.node.state().auth();
        let user = auth.users.get(&name).ok_or(crate::model::auth::AuthError::UserNotFound).map_err(error::auth)?;
        let roles = user.roles.clone();
        drop(auth);
        Ok(Response::new(pb::AuthUserGetResponse { header: header(&self.node, self.node.revision()), roles }))
    }

    async fn user_list(
        &self,
        req: Request<pb::AuthUserListRequest>,
    ) -> Result<Response<pb::AuthUserListResponse>, Status> {
        let caller = self.reader(&req).await?;
        check_admin(&self.node, &caller)?;
        let users = self.node.state().auth().users.keys().cloned().collect();
        Ok(Response::new(pb::AuthUserListResponse { header: header(&self.node, self.node.revision()), users }))
    }

    async fn user_delete(
        &self,
        req: Request<pb::AuthUserDeleteRequest>,
    ) -> Result<Response<pb::AuthUserDeleteResponse>, Status> {
        let name = req.get_ref().name.clone();
        let header = self.change(&req, AuthCommand::UserDelete { name }).await?;
        Ok(Response::new(pb::AuthUserDeleteResponse { header }))
    }

    async fn user_change_password(
        &self,
        req: Request<pb::AuthUserChangePasswordRequest>,
    ) -> Result<Response<pb::AuthUserChangePasswordResponse>, Status> {
        let caller = admin(&self.node, &req).await?;
        let req = req.into_inner();
        let password = self.node.hash_password(req.password).await.map_err(error::write)?;
        let header = self.apply(AuthCommand::UserChangePassword { name: req.name, password }, &caller).await?;
        Ok(Response::new(pb::AuthUserChangePasswordResponse { header }))
    }

    async fn user_grant_role(
        &self,
        req: Request<pb::AuthUserGrantRoleRequest>,
    ) -> Result<Response<pb::AuthUserGrantRoleResponse>, Status> {
        let (user, role) = (req.get_ref().user.clone(), req.get_ref().role.clone());
        let header = self.change(&req, AuthCommand::UserGrantRole { user, role }).await?;
        Ok(Response::new(pb::AuthUserGrantRoleResponse { header }))
    }

    async fn user_revoke_role(
        &self,
        req: Request<pb::AuthUserRevokeRoleRequest>,
    ) -> Result<Response<pb::AuthUserRevokeRoleResponse>, Status> {
        let (user, role) = (req.get_ref().name.clone(), req.get_ref().role.clone());
        let header = self.change(&req, AuthCommand::UserRevokeRole { user, role }).await?;
        Ok(Response::new(pb::AuthUserRevokeRoleResponse { header }))
    }

    async fn role_add(
        &self,
        req: Request<pb::AuthRoleAddRequest>,
    ) -> Result<Response<pb::AuthRoleAddResponse>, Status> {
        let name = req.get_ref().name.clone();
        let header = self.change(&req, AuthCommand::RoleAdd { name }).await?;
        Ok(Response::new(pb::AuthRoleAddResponse { header }))
    }

    async fn role_get(
        &self,
        req: Request<pb::AuthRoleGetRequest>,
    ) -> Result<Response<pb::AuthRoleGetResponse>, Status> {
        let caller = self.reader(&req).await?;
        let name = req.into_inner().role;
        let auth = self.node.state().auth();
        if !auth.has_role(&caller.user, &name) {
            auth.check_admin(&caller).map_err(error::auth)?;
        }
        let role = auth.roles.get(&name).ok_or(crate::model::auth::AuthError::RoleNotFound).map_err(error::auth)?;
        let perm = role
            .perms
            .iter()
            .map(|p| authpb::Permission {
                perm_type: perm_type(p.kind),
                key: p.key.clone(),
                range_end: p.range_end.clone(),
            })
            .collect();
        drop(auth);
        Ok(Response::new(pb::AuthRoleGetResponse { header: header(&self.node, self.node.revision()), perm }))
    }

    async fn role_list(
        &self,
        req: Request<pb::AuthRoleListRequest>,
    ) -> Result<Response<pb::AuthRoleListResponse>, Status> {
        let caller = self.reader(&req).await?;
        check_admin(&self.node, &caller)?;
        let roles = self.node.state().auth().roles.keys().cloned().collect();
        Ok(Response::new(pb::AuthRoleListResponse { header: header(&self.node, self.node.revision()), roles }))
    }

    async fn role_delete(
        &self,
        req: Request<pb::AuthRoleDeleteRequest>,
    ) -> Result<Response<pb::AuthRoleDeleteResponse>, Status> {
        let name = req.get_ref().role.clone();
        let header = self.change(&req, AuthCommand::RoleDelete { name }).await?;
        Ok(Response::new(pb::AuthRoleDeleteResponse { header }))
    }

    async fn role_grant_permission(
        &self,
        req: Request<pb::AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<pb::AuthRoleGrantPermissionResponse>, Status> {
        let caller = admin(&self.node, &req).await?;
        let req = req.into_inner();
        let perm = req.perm.ok_or(crate::model::auth::AuthError::PermissionNotGiven).map_err(error::auth)?;
        let perm = Permission { kind: perm_kind(perm.perm_type), key: perm.key, range_end: perm.range_end };
        let header = self.apply(AuthCommand::RoleGrantPermission { role: req.name, perm }, &caller).await?;
        Ok(Response::new(pb::AuthRoleGrantPermissionResponse { header }))
    }

    async fn role_revoke_permission(
        &self,
        req: Request<pb::AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<pb::AuthRoleRevokePermissionResponse>, Status> {
        let caller = admin(&self.node, &req).await?;
        let req = req.into_inner();
        let cmd = AuthCommand::RoleRevokePermission { role: req.role, key: req.key, range_end: req.range_end };
        let header = self.apply(cmd, &caller).await?;
        Ok(Response::new(pb::AuthRoleRevokePermissionResponse { header }))
    }
}
