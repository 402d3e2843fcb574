//! Deciding before writing: the checked inputs of a run ([`Job`]), what happens
//! to each leaf certificate ([`LeafPlan`]), and carrying the plans out ([`Run`]),
//! with the warnings an operator should see.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use rcgen::ExtendedKeyUsagePurpose;
use time::{Duration, OffsetDateTime};

use super::ca::{self, Ca, CaFiles};
use super::files::{self, kept, with_extension};
use super::leaf::{self, Existing, LeafState};
use super::names::{self, San};
use super::secrets::{self, PairPlan};
use super::{
    inventory, CaOrigin, PkiError, PkiFile, PkiOptions, PkiReport, CLOCK_SKEW, EXPIRY_WARNING_DAYS,
    SERVER_COMMON_NAME,
};

/// The checked inputs of a run.
pub(super) struct Job {
    /// Client CNs without repeats (for [`issue`](super::issue), receivers included).
    pub(super) clients: Vec<String>,
    /// Receiver CNs without repeats.
    pub(super) receivers: Vec<String>,
    /// The CA directory in use.
    pub(super) ca_dir: PathBuf,
}

impl Job {
    /// Validates `opts`: days, names, directories, file collisions.
    pub(super) fn new(opts: &PkiOptions, receivers_are_clients: bool) -> Result<Job, PkiError> {
        if opts.validity_days == 0 {
            return Err(PkiError::InvalidOption(
                "validity_days must be at least 1".into(),
            ));
        }
        let receivers = dedup(&opts.receiver_cns);
        let mut clients = opts.client_cns.clone();
        if receivers_are_clients {
            clients.extend(receivers.iter().cloned());
        }
        let clients = dedup(&clients);
        for cn in clients.iter().chain(&receivers) {
            names::validate_cn(cn)?;
        }
        for cn in &clients {
            names::validate_file_names(cn, false)?;
        }
        for cn in &receivers {
            names::validate_file_names(cn, true)?;
        }
        let ca_dir = opts.ca_dir();
        for (other, what) in [(&opts.out_dir, "certificate"), (&opts.keys_dir, "keys")] {
            if files::same_dir(&ca_dir, other) {
                return Err(PkiError::InvalidOption(format!(
                    "the CA directory {} is the {what} directory: the CA key must live apart from the leaf keys (choose another --ca-dir)",
                    ca_dir.display()
                )));
            }
        }
        check_collisions(opts, &clients, &receivers)?;
        Ok(Job {
            clients,
            receivers,
            ca_dir,
        })
    }
}

/// How an existing client certificate is treated when not forced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Strictness {
    /// Kept ([`generate`](super::generate): make what is missing).
    KeepExisting,
    /// Refused ([`issue`](super::issue): the operator asked for a new one).
    RefuseExisting,
    /// Kept, since the run makes the receiver's missing key pair.
    KeepForNewPair,
}

/// What to do with one leaf certificate.
#[derive(Debug)]
pub(super) enum Step {
    /// None exists: issue one.
    Create,
    /// Keep the one on disk.
    Keep(Existing),
    /// Replace the one on disk.
    Reissue,
}

/// One leaf certificate's plan.
#[derive(Debug)]
pub(super) struct LeafPlan {
    /// Its CN.
    cn: String,
    /// `{out_dir}/{stem}` without extension.
    stem: PathBuf,
    /// SANs to issue with (the server's).
    sans: Vec<San>,
    /// Server or client.
    usage: ExtendedKeyUsagePurpose,
    /// Create, keep or re-issue.
    step: Step,
    /// The command that renews it, for expiry warnings.
    renew: String,
}

/// Plans the server certificate: keep it if it covers `requested`, else refuse;
/// re-issue with the union of names when forced or when the CA is new.
pub(super) fn plan_server(
    opts: &PkiOptions,
    ca: Option<&Ca>,
    requested: &[San],
) -> Result<LeafPlan, PkiError> {
    let stem = opts.out_dir.join("server");
    let crt = with_extension(&stem, "crt");
    let (step, sans) = match leaf::inspect(&stem, SERVER_COMMON_NAME, ca)? {
        LeafState::Missing => (Step::Create, requested.to_vec()),
        LeafState::Good(existing) => {
            let missing: Vec<String> = requested
                .iter()
                .filter(|san| !existing.sans.contains(san))
                .map(San::to_string)
                .collect();
            if opts.force {
                let sans = names::union(&existing.sans, requested);
                (Step::Reissue, sans)
            } else if !missing.is_empty() {
                return Err(PkiError::ServerSans {
                    path: crt,
                    missing,
                    present: existing.sans.iter().map(San::to_string).collect(),
                });
            } else {
                let sans = existing.sans.clone();
                (Step::Keep(existing), sans)
            }
        }
        LeafState::Bad { reason, sans } => {
            if opts.force || ca.is_none() {
                (Step::Reissue, names::union(&sans, requested))
            } else {
                return Err(PkiError::ExistingCertificate { path: crt, reason });
            }
        }
    };
    Ok(LeafPlan {
        cn: SERVER_COMMON_NAME.into(),
        stem,
        sans,
        usage: ExtendedKeyUsagePurpose::ServerAuth,
        step,
        renew: "ciphermq-pki init --force".into(),
    })
}

/// Plans one client certificate.
pub(super) fn plan_client(
    opts: &PkiOptions,
    cn: &str,
    ca: Option<&Ca>,
    strictness: Strictness,
) -> Result<LeafPlan, PkiError> {
    let stem = opts.out_dir.join(cn);
    let crt = with_extension(&stem, "crt");
    let step = match leaf::inspect(&stem, cn, ca)? {
        LeafState::Missing => Step::Create,
        _ if opts.force => Step::Reissue,
        LeafState::Good(existing) => match strictness {
            Strictness::RefuseExisting => {
                return Err(PkiError::CertificateExists {
                    path: crt,
                    cn: cn.to_owned(),
                    not_after: inventory::human_time(existing.not_after),
                })
            }
            Strictness::KeepExisting | Strictness::KeepForNewPair => Step::Keep(existing),
        },
        LeafState::Bad { .. } if ca.is_none() => Step::Reissue,
        LeafState::Bad { reason, .. } => {
            return Err(PkiError::ExistingCertificate { path: crt, reason })
        }
    };
    Ok(LeafPlan {
        cn: cn.to_owned(),
        stem,
        sans: Vec::new(),
        usage: ExtendedKeyUsagePurpose::ClientAuth,
        step,
        renew: format!("ciphermq-pki issue --force {cn}"),
    })
}

/// Plans every receiver's key pair.
pub(super) fn plan_pairs(
    opts: &PkiOptions,
    receivers: &[String],
) -> Result<Vec<(String, PairPlan)>, PkiError> {
    receivers
        .iter()
        .map(|cn| Ok((cn.clone(), secrets::plan_pair(&opts.keys_dir, cn)?)))
        .collect()
}

/// The files and warnings of a run in progress.
#[derive(Default)]
pub(super) struct Run {
    /// Every file handled so far.
    pub(super) files: Vec<PkiFile>,
    /// Warnings so far.
    warnings: Vec<String>,
}

impl Run {
    /// Records a warning if there is one.
    pub(super) fn warn(&mut self, warning: Option<String>) {
        self.warnings.extend(warning);
    }

    /// Records the CA on disk as kept, with warnings about where its key is and
    /// who may read it.
    pub(super) fn use_existing_ca(
        &mut self,
        ca_files: &CaFiles,
        ca_dir: &Path,
    ) -> Result<(), PkiError> {
        self.files.push(kept(&ca_files.crt, false));
        self.files.push(kept(&ca_files.key, true));
        if ca_files.legacy {
            self.warnings
                .push(ca::legacy_warning(&ca_files.key, ca_dir));
        } else {
            self.warn(files::loose_ca_dir_warning(ca_dir)?);
        }
        self.warn(files::loose_secret_warning(&ca_files.key)?);
        Ok(())
    }

    /// Carries out one leaf plan; a kept certificate near or past its expiry is
    /// reported.
    pub(super) fn carry_out(
        &mut self,
        plan: &LeafPlan,
        ca: &Ca,
        validity_days: u32,
        now: OffsetDateTime,
    ) -> Result<(), PkiError> {
        match &plan.step {
            Step::Keep(existing) => {
                let crt = with_extension(&plan.stem, "crt");
                self.files.push(kept(&crt, false));
                self.files
                    .push(kept(&with_extension(&plan.stem, "key"), true));
                let left = existing.not_after - now;
                let when = inventory::human_time(existing.not_after);
                if left <= Duration::ZERO {
                    self.warnings.push(format!(
                        "{} expired on {when}; renew it: {}",
                        crt.display(),
                        plan.renew
                    ));
                } else if left < Duration::days(EXPIRY_WARNING_DAYS) {
                    self.warnings.push(format!(
                        "{} expires on {when}; renew it: {}",
                        crt.display(),
                        plan.renew
                    ));
                }
            }
            Step::Create | Step::Reissue => {
                let not_after = (now + Duration::days(i64::from(validity_days))).min(ca.not_after);
                leaf::sign(
                    ca,
                    &plan.cn,
                    &plan.sans,
                    plan.usage.clone(),
                    (now - CLOCK_SKEW, not_after),
                    &plan.stem,
                    &mut self.files,
                )?;
            }
        }
        Ok(())
    }

    /// The finished report.
    pub(super) fn report(self, ca: CaOrigin) -> PkiReport {
        PkiReport {
            ca,
            files: self.files,
            warnings: self.warnings,
        }
    }
}

/// The names in order of first appearance, without repeats.
fn dedup(names: &[String]) -> Vec<String> {
    let mut seen = HashSet::new();
    names
        .iter()
        .filter(|n| seen.insert(n.as_str()))
        .cloned()
        .collect()
}

/// Refuses inputs that would make two outputs share a file, before anything is
/// written.
fn check_collisions(
    opts: &PkiOptions,
    clients: &[String],
    receivers: &[String],
) -> Result<(), PkiError> {
    let mut paths = vec![
        opts.out_dir.join("ca.crt"),
        opts.out_dir.join("ca.key"),
        opts.out_dir.join("server.crt"),
        opts.out_dir.join("server.key"),
        opts.out_dir.join("aes.key"),
    ];
    for cn in clients {
        paths.push(opts.out_dir.join(format!("{cn}.crt")));
        paths.push(opts.out_dir.join(format!("{cn}.key")));
    }
    for cn in receivers {
        paths.push(opts.keys_dir.join(format!("{cn}_private.key")));
        paths.push(opts.keys_dir.join(format!("{cn}_public.key")));
    }
    let mut seen = HashSet::new();
    for path in paths {
        if !seen.insert(path.clone()) {
            return Err(PkiError::PathCollision(path));
        }
    }
    Ok(())
}

/// After a new CA: the client certificates in `out_dir` this run did not re-issue,
/// which the old CA signed and nobody trusts any more.
pub(super) fn orphaned_certificates(
    opts: &PkiOptions,
    handled: &[String],
) -> Result<Option<String>, PkiError> {
    let orphans: Vec<String> = files::file_names(&opts.out_dir)?
        .into_iter()
        .filter_map(|name| name.strip_suffix(".crt").map(str::to_owned))
        .filter(|stem| stem != "ca" && stem != "server" && !handled.contains(stem))
        .collect();
    Ok((!orphans.is_empty()).then(|| {
        format!(
            "the new CA does not trust the certificates of {} in {}; re-issue them: ciphermq-pki issue --force {}",
            orphans.join(", "),
            opts.out_dir.display(),
            orphans.join(" ")
        )
    }))
}
