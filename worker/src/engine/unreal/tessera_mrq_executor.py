# Tessera's Movie Render Queue executor. Unreal runs this file at start
# (it is a content-only plugin's Content/Python/init_unreal.py); MRQ then
# instantiates the class named by -ExecutorPythonClass.
#
# NOT RUN AGAINST A REAL UNREAL: written from Epic's documentation of the
# Python host executor (command-line rendering page,
# https://dev.epicgames.com/documentation/en-us/unreal-engine/using-command-line-rendering-with-move-render-queue-in-unreal-engine)
# and the Python API (MoviePipelinePythonHostExecutor, MoviePipelineQueue,
# MoviePipelineOutputSetting). Tessera's tests drive a stand-in instead.
#
# It reads the task from the JSON file named by TESSERA_MRQ_TASK: the
# sequence, map and config asset paths, the frames to render (warm-up
# included) and the output directory; it prints the `TesseraMRQ:` lines the
# worker reads (progress, each file written, the end).
import json
import os

import unreal


def say(line):
    unreal.log("TesseraMRQ: " + line)


@unreal.uclass()
class TesseraMoviePipelineExecutor(unreal.MoviePipelinePythonHostExecutor):
    pipeline = unreal.uproperty(unreal.MoviePipeline)
    job = unreal.uproperty(unreal.MoviePipelineExecutorJob)

    def _post_init(self):
        self.pipeline = None
        self.queue = None
        self.task = None

    @unreal.ufunction(override=True)
    def execute_delayed(self, in_pipeline_queue):
        try:
            with open(os.environ["TESSERA_MRQ_TASK"]) as f:
                self.task = json.load(f)
            task = self.task
            self.queue = unreal.new_object(unreal.MoviePipelineQueue, outer=self)
            job = self.queue.allocate_new_job(unreal.MoviePipelineExecutorJob)
            job.sequence = unreal.SoftObjectPath(task["level_sequence"])
            job.map = unreal.SoftObjectPath(task["map"])
            preset = unreal.load_asset(task["config"])
            if preset is None:
                say("error the config " + task["config"] + " could not be loaded")
                self.on_executor_errored()
                return
            job.set_configuration(preset)
            config = job.get_configuration()
            out = config.find_or_add_setting_by_class(unreal.MoviePipelineOutputSetting)
            out.use_custom_playback_range = True
            out.custom_start_frame = task["start_frame"]
            # CustomEndFrame is exclusive, like the sequence's playback range.
            out.custom_end_frame = task["end_frame"] + 1
            out.output_directory = unreal.DirectoryPath(task["output_directory"])
            self.job = job
            self.pipeline = unreal.new_object(unreal.MoviePipeline, outer=self.get_last_loaded_world())
            self.pipeline.on_movie_pipeline_work_finished_delegate.add_function_unique(self, "on_finished")
            self.pipeline.initialize(job)
        except Exception as e:  # report, never hang
            say("error " + str(e))
            self.on_executor_errored()

    @unreal.ufunction(override=True)
    def on_begin_frame(self):
        super(TesseraMoviePipelineExecutor, self).on_begin_frame()
        if self.pipeline and self.task:
            total = self.task["end_frame"] - self.task["start_frame"] + 1
            done = int(unreal.MoviePipelineLibrary.get_completion_percentage(self.pipeline) * total)
            say("progress %d/%d" % (done, total))

    @unreal.ufunction(ret=None, params=[unreal.MoviePipelineOutputData])
    def on_finished(self, results):
        for shot in results.shot_data:
            for passes in shot.render_pass_data.values():
                for path in passes.file_paths:
                    frame = int(os.path.splitext(path)[0].rsplit(".", 1)[-1].rsplit("_", 1)[-1])
                    say("wrote %d %s" % (frame, path))
        say("finished success=%s" % bool(results.success))
        self.on_executor_finished_impl()

    @unreal.ufunction(override=True)
    def is_rendering(self):
        return self.pipeline is not None
