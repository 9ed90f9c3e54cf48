//! Blender matching: which of a worker's Blenders can render a job, and, when
//! no connected worker has one, the reason a person reads in `status`
//! (`needs Blender 4.5; workers offer 3.4, 4.2`). Pure functions over the
//! protocol's [`BlenderNeeds`] and [`BlenderOffer`]s, and the scheduler's
//! record of what each Blender job needs and each worker offers.

use tessera_protocol::blender::{BlenderNeeds, BlenderOffer};

use super::{JobId, Scheduler, WorkerId};

/// Why `offer` cannot render a job with `needs`, or `None` when it can.
pub fn unmet(needs: &BlenderNeeds, offer: &BlenderOffer) -> Option<String> {
    needs.unmet(offer)
}

/// The index of the first of `offers` that can render a job with `needs`.
pub fn pick(needs: &BlenderNeeds, offers: &[BlenderOffer]) -> Option<usize> {
    needs.pick(offers)
}

/// Why no offer among `offers` (every Blender of every connected worker)
/// can render a job with `needs`; `None` when one can.
pub fn blocked_reason(needs: &BlenderNeeds, offers: &[&BlenderOffer]) -> Option<String> {
    if offers.iter().any(|o| unmet(needs, o).is_none()) {
        return None;
    }
    let mut series: Vec<(u16, u16)> = offers.iter().map(|o| o.version.series()).collect();
    series.sort_unstable();
    series.dedup();
    let listed = series
        .iter()
        .map(|(a, b)| format!("{a}.{b}"))
        .collect::<Vec<_>>()
        .join(", ");
    let right_version: Vec<&&BlenderOffer> = offers
        .iter()
        .filter(|o| {
            needs.version.matches(o.version)
                && needs
                    .saved_by
                    .is_none_or(|s| o.version.series() >= s.series())
        })
        .collect();
    Some(match right_version.first() {
        // The version is there; something else is missing.
        Some(o) => unmet(needs, o).expect("no offer fits"),
        None if offers.is_empty() => {
            format!(
                "needs Blender {}; no connected worker offers Blender",
                want(needs)
            )
        }
        None => format!("needs Blender {}; workers offer {listed}", want(needs)),
    })
}

/// The version a person should provide: the request, raised to the file's
/// own version when that is newer.
fn want(needs: &BlenderNeeds) -> String {
    match needs.saved_by {
        Some(s) if s.series() > needs.version.floor() => format!(">={}", s.short()),
        _ => needs.version.to_string(),
    }
}

impl Scheduler {
    /// What Blender `job` needs; a Blender job without this runs on any
    /// worker offering the engine (jobs stored before versions were known).
    pub fn set_job_blender(&mut self, job: JobId, needs: BlenderNeeds) {
        self.blender_needs.insert(job, needs);
    }

    /// The Blenders `worker` offers.
    pub fn set_worker_blenders(&mut self, worker: WorkerId, offers: Vec<BlenderOffer>) {
        self.blender_offers.insert(worker, offers);
    }

    /// Whether one of `worker`'s Blenders can render `job` (true for jobs
    /// with no Blender needs).
    pub(super) fn blender_fits(&self, worker: WorkerId, job: JobId) -> bool {
        let Some(needs) = self.blender_needs.get(&job) else {
            return true;
        };
        let offers = self
            .blender_offers
            .get(&worker)
            .map_or(&[][..], Vec::as_slice);
        pick(needs, offers).is_some()
    }

    /// Why no connected worker can render Blender job `job`, if none can:
    /// `needs Blender 4.5; workers offer 3.4, 4.2`.
    pub fn blender_blocked(&self, job: JobId) -> Option<String> {
        let needs = self.blender_needs.get(&job)?;
        let offers: Vec<&BlenderOffer> = (self.workers.keys())
            .filter_map(|w| self.blender_offers.get(w))
            .flatten()
            .collect();
        blocked_reason(needs, &offers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_protocol::blender::{BlenderVersion, VersionReq};

    fn offer(v: (u16, u16, u16), name: &str, oidn: bool) -> BlenderOffer {
        BlenderOffer {
            version: BlenderVersion::new(v.0, v.1, v.2),
            name: name.into(),
            device_types: vec![],
            devices: vec![],
            render_device: "CPU".into(),
            oidn,
            osl: oidn,
            eevee: false,
        }
    }

    fn needs(saved: (u16, u16), req: VersionReq) -> BlenderNeeds {
        BlenderNeeds {
            saved_by: Some(BlenderVersion::new(saved.0, saved.1, 0)),
            version: req,
            denoise: false,
            osl: false,
            eevee: false,
        }
    }

    #[test]
    fn a_job_goes_to_its_own_series_unless_it_says_otherwise() {
        let debian = offer((3, 4, 1), "Debian's Blender 3.4.1", false);
        let lts42 = offer((4, 2, 23), "Blender 4.2.23 LTS (bpy)", true);
        let lts45 = offer((4, 5, 4), "Blender 4.5.4 LTS (bpy)", true);
        let five = offer((5, 0, 1), "Blender 5.0.1 (bpy)", true);
        let file45 = needs((4, 5), VersionReq::Series(4, 5));
        assert_eq!(unmet(&file45, &lts45), None);
        assert!(unmet(&file45, &five).is_some());
        assert_eq!(
            pick(&file45, &[debian.clone(), lts42.clone(), lts45.clone()]),
            Some(2)
        );
        assert_eq!(
            blocked_reason(&file45, &[&debian, &lts42]).as_deref(),
            Some("needs Blender 4.5; workers offer 3.4, 4.2")
        );
        assert_eq!(blocked_reason(&file45, &[&debian, &lts45]), None);
        // `--blender '>=4.2'` on a 4.2 file: 4.5 and 5.0 will do, 3.4 not.
        let at_least = needs((4, 2), VersionReq::AtLeast(4, 2));
        assert_eq!(pick(&at_least, &[debian.clone(), five.clone()]), Some(1));
        // A 4.5 file never goes to an older Blender, whatever was asked.
        let forced = needs((4, 5), VersionReq::AtLeast(3, 4));
        assert!(unmet(&forced, &debian).unwrap().contains("cannot read it"));
        assert_eq!(
            blocked_reason(&forced, &[&debian, &lts42]).as_deref(),
            Some("needs Blender >=4.5; workers offer 3.4, 4.2")
        );
        assert_eq!(
            blocked_reason(&file45, &[]).as_deref(),
            Some("needs Blender 4.5; no connected worker offers Blender")
        );
    }

    #[test]
    fn a_job_waits_for_a_worker_with_its_blender_while_others_run() {
        use crate::scheduler::{Config, NewJob, Scheduler};
        let mut s = Scheduler::new(Config {
            lease_ms: 10_000,
            max_attempts: 3,
            first_epoch: 1,
            retry_backoff_ms: 0,
            straggler_percent: 0,
        });
        let job = |id, priority, tasks| NewJob {
            id,
            priority,
            submit_seq: id,
            engine: "blender".into(),
            pending: (0..tasks).collect(),
            total: tasks,
        };
        // Job 1 (a 4.5 file) outranks job 2 (a 3.4 file).
        s.add_job(job(1, 5, 2), 0);
        s.set_job_blender(1, needs((4, 5), VersionReq::Series(4, 5)));
        s.add_job(job(2, 0, 1), 0);
        s.set_job_blender(2, needs((3, 4), VersionReq::Series(3, 4)));
        s.add_worker(10, 2, vec!["blender".into()], 0);
        s.set_worker_blenders(10, vec![offer((3, 4, 1), "Debian's Blender 3.4.1", false)]);
        let given: Vec<_> = (s.assign(0).iter())
            .map(|a| (a.worker, a.task.job, a.task.index))
            .collect();
        assert_eq!(
            given,
            [(10, 2, 0)],
            "the 3.4 worker never gets the 4.5 file"
        );
        assert_eq!(
            s.blender_blocked(1).as_deref(),
            Some("needs Blender 4.5; workers offer 3.4")
        );
        assert_eq!(s.blender_blocked(2), None);
        s.add_worker(11, 2, vec!["blender".into()], 1);
        s.set_worker_blenders(11, vec![offer((4, 5, 4), "Blender 4.5.4 LTS (bpy)", true)]);
        assert_eq!(s.blender_blocked(1), None);
        let mut given: Vec<_> = (s.assign(1).iter())
            .map(|a| (a.worker, a.task.job, a.task.index))
            .collect();
        given.sort_unstable();
        assert_eq!(given, [(11, 1, 0), (11, 1, 1)]);
        // The 4.5 worker leaves: its tasks wait again, not on the 3.4 one.
        s.remove_worker(11, 2);
        assert!(s.assign(2).is_empty());
        assert_eq!(
            s.blender_blocked(1).as_deref(),
            Some("needs Blender 4.5; workers offer 3.4")
        );
    }

    #[test]
    fn a_feature_the_build_lacks_blocks_with_its_reason() {
        let debian = offer((3, 4, 1), "Debian's Blender 3.4.1", false);
        let mut job = needs((3, 4), VersionReq::Series(3, 4));
        job.denoise = true;
        assert_eq!(
            blocked_reason(&job, &[&debian]).as_deref(),
            Some("denoising needs OpenImageDenoise; Debian's Blender 3.4.1 is built without it")
        );
        job.denoise = false;
        job.osl = true;
        assert!(blocked_reason(&job, &[&debian]).unwrap().contains("OSL"));
        job.osl = false;
        job.eevee = true;
        assert!(blocked_reason(&job, &[&debian])
            .unwrap()
            .contains("GPU context"));
        job.eevee = false;
        assert_eq!(blocked_reason(&job, &[&debian]), None);
    }
}
