//! The farm core's Blender builds: a worker started with `--blender auto`
//! offers every build stored with `blender add` beside its own Blenders,
//! so a job whose Blender no worker has installed still finds one; such a
//! worker is told the builds when it joins and whenever one is added.

use tessera_protocol::blender::BlenderOffer;
use tessera_protocol::build::BuildInfo;
use tessera_protocol::messages::{CoordMsg, WorkerInfo};
use tessera_protocol::Digest;

use super::{Effect, FarmCore};

impl FarmCore {
    /// The Blenders a worker can render with: its own, then (with
    /// `--blender auto`) each stored build, in the order the worker picks.
    pub(crate) fn offers_of(&self, info: &WorkerInfo) -> Vec<BlenderOffer> {
        let mut offers = info.blenders.clone();
        if info.fetches_builds {
            offers.extend(self.builds.iter().map(BuildInfo::offer));
        }
        offers
    }

    /// The stored builds changed (on start, and after `blender add`): every
    /// `--blender auto` worker now offers them and is told.
    pub fn set_builds(&mut self, builds: Vec<BuildInfo>) {
        self.builds = builds;
        let auto: Vec<_> = (self.workers.iter())
            .filter(|(_, w)| w.info.fetches_builds)
            .map(|(id, w)| (*id, self.offers_of(&w.info)))
            .collect();
        for (id, offers) in auto {
            self.sched.set_worker_blenders(id, offers);
            self.send(id, CoordMsg::Builds(self.builds.clone()));
        }
        self.effects.push(Effect::Wake);
    }

    /// The names of the connected workers whose caches hold every file of
    /// a build (`files`: the digests its manifest lists), sorted.
    pub fn holders(&self, files: &[Digest]) -> Vec<String> {
        let mut names: Vec<String> = (self.workers.iter())
            .filter(|(id, _)| self.sched.worker_holds_all(**id, files))
            .map(|(_, w)| w.name.clone())
            .collect();
        names.sort();
        names
    }
}
