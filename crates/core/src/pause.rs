//! Pause points for crash tests. A test arms a point for its staging directory; the code
//! that passes it stops there until the test lets it go, and what is on disk meanwhile is
//! what a crash at that point leaves (deletes_tests.rs copies it, then lets the call go on).
//! Outside tests a point is an empty function.

#[cfg(not(test))]
#[inline(always)]
pub(crate) async fn point(_staging: &std::path::Path, _name: &str) {}

#[cfg(test)]
pub(crate) use armed::{arm, point};

#[cfg(test)]
mod armed {
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Mutex};

    use tokio::sync::Semaphore;

    type Point = (PathBuf, &'static str, Arc<Semaphore>, Arc<Semaphore>);

    /// (staging directory, point, its "reached" permits, its "go on" permits).
    static ARMED: Mutex<Vec<Point>> = Mutex::new(Vec::new());

    /// A point armed by [`arm`]: disarmed when dropped.
    pub(crate) struct Armed {
        staging: PathBuf,
        name: &'static str,
        reached: Arc<Semaphore>,
        go: Arc<Semaphore>,
    }

    /// Stop the calls passing point `name` for `staging` from now on.
    pub(crate) fn arm(staging: &Path, name: &'static str) -> Armed {
        let (reached, go) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
        ARMED.lock().unwrap().push((staging.to_path_buf(), name, reached.clone(), go.clone()));
        Armed { staging: staging.to_path_buf(), name, reached, go }
    }

    impl Armed {
        /// Wait until a call stops at the point.
        pub(crate) async fn reached(&self) {
            self.reached.acquire().await.unwrap().forget();
        }

        /// Let the stopped call go on.
        pub(crate) fn go(&self) {
            self.go.add_permits(1);
        }
    }

    impl Drop for Armed {
        fn drop(&mut self) {
            ARMED.lock().unwrap().retain(|(s, n, _, _)| !(s == &self.staging && *n == self.name));
            self.go.add_permits(1 << 20); // nothing stays stopped
        }
    }

    pub(crate) async fn point(staging: &Path, name: &str) {
        let found = ARMED.lock().unwrap().iter().find(|(s, n, _, _)| s == staging && *n == name).cloned();
        if let Some((_, _, reached, go)) = found {
            reached.add_permits(1);
            go.acquire().await.unwrap().forget();
        }
    }
}
